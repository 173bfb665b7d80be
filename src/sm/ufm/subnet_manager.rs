//! [`UfmSm`] as a [`SubnetManager`]: one apply under the backend's lock (the ledger loaded,
//! the credential checked, `apply_locked` run), then the acknowledgement rule: no set is
//! acknowledged while a key it no longer gives is watched for a late add, or while a restore
//! watch stands (module docs, "Late writes" and "Store restores").

use super::auth;
use super::http::{Exchange, ReqwestLink};
use super::{refused, Failure, UfmError, UfmLedger, UfmSm};
use crate::domain::{Guid, NodeMemberships};
use crate::sm::{ApplyOutcome, SmError, SmFailure, SubnetManager};
use async_trait::async_trait;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};

#[async_trait]
impl SubnetManager for UfmSm {
    fn backend(&self) -> &'static str {
        "ufm"
    }

    fn conditions(&self) -> Vec<crate::domain::Condition> {
        let late = self.late_writes_mut();
        if late.is_empty() {
            return Vec::new();
        }
        vec![crate::domain::Condition {
            kind: crate::domain::ConditionKind::UfmLateWrite,
            detail: late.values().cloned().collect::<Vec<_>>().join("; "),
        }]
    }

    async fn apply(
        &self,
        desired: &NodeMemberships,
        _generation: u64,
    ) -> Result<ApplyOutcome, SmError> {
        let ports: BTreeSet<Guid> = desired.port_guids.iter().copied().collect();
        if ports.is_empty() && !desired.keys.is_empty() {
            return Err(refused(UfmError::NoPorts));
        }
        let mut state = self.state.lock().await;
        self.load_ledger(&mut state).await?;
        if ports.is_empty() && state.ledger.as_ref().is_some_and(UfmLedger::is_empty) {
            return Ok(ApplyOutcome {
                detail: "UFM: no fabric ports and no GUIDs of this node in any key, nothing to do"
                    .into(),
                acknowledged_by: Vec::new(),
            });
        }
        let loaded = auth::load(&self.auth).await?;
        if let Some((fingerprint, status)) = state.rejected {
            if fingerprint == loaded.fingerprint {
                return Err(refused(Self::rejected(&loaded, status)));
            }
        }
        self.refresh_identity(&mut state, &loaded)?;
        let client = state.client.clone();
        let reqwest = ReqwestLink {
            client: &client,
            credential: &loaded,
        };
        let ex = Exchange {
            link: self.link.as_deref().unwrap_or(&reqwest),
            base: &self.base,
            credential: &loaded,
            policy: self.policy,
            sent: AtomicUsize::new(0),
            budget: &self.budget,
        };
        let mut result = self.apply_locked(&mut state, desired, &ports, &ex).await;
        if result.is_ok() {
            // A released key still watched for a late add, or a watched key that still holds
            // GUIDs no longer given it (a port released while another keeps the key), is not
            // acknowledged: the node says RELEASED only when nothing it sent can still land
            // (module docs, late writes).
            let ledger = state.ledger.as_ref().expect("the ledger is loaded");
            if let Some((key, until)) = ledger.watched().find(|(k, _)| {
                !desired.keys.contains_key(k) || {
                    let given: BTreeSet<Guid> = desired.guids_for(*k).into_iter().collect();
                    !ledger.guids(*k).is_subset(&given)
                }
            }) {
                result = Err(Failure::NoAnswer(UfmError::LateWriteWindow {
                    key,
                    until_unix_ms: until,
                }));
            } else if let Some(until) = ledger.restore_watched_until() {
                // Any key may still receive an add the restored ledger forgot: no set is
                // acknowledged until the restore watch ended (module docs, store restores).
                result = Err(Failure::NoAnswer(UfmError::RestoreWatch {
                    until_unix_ms: until,
                    list_unread: state.restore_unread,
                }));
            }
        }
        let sent = ex.sent.load(Ordering::Relaxed);
        match result {
            Ok(s) if s.skipped => {
                state.rejected = None;
                Ok(ApplyOutcome {
                    detail: format!(
                        "UFM: partitions unchanged since the last confirming read (same last_updated stamp); {} key(s) right ({sent} requests)",
                        s.unchanged
                    ),
                    acknowledged_by: Vec::new(),
                })
            }
            Ok(s) => {
                state.rejected = None;
                Ok(ApplyOutcome {
                    detail: format!(
                        "UFM: {} key(s) programmed, {} released, {} already right ({sent} requests)",
                        s.programmed, s.released, s.unchanged
                    ),
                    acknowledged_by: Vec::new(),
                })
            }
            Err(Failure::Rejected(status)) => {
                state.rejected = Some((loaded.fingerprint, status));
                let e = Self::rejected(&loaded, status);
                tracing::warn!(error = %e, "UFM apply refused");
                Err(refused(e))
            }
            Err(Failure::Refused(e)) => Err(refused(e)),
            Err(Failure::NoAnswer(e)) => Err(SmError::Unreachable(SmFailure::Ufm(e))),
        }
    }
}
