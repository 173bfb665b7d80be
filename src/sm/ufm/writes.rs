//! UFM's partition writes for [`UfmSm`]: adding GUIDs to a key, and removing them (the
//! deprecated action, else the resource's DELETE form, remembered once UFM lacks the action).

use super::http::Exchange;
use super::wire::{self, guid_text, pkey_text};
use super::{Failure, RemovalForm, UfmSm};
use crate::domain::{Guid, Membership, PKey};
use reqwest::{Method, StatusCode};

impl UfmSm {
    pub(super) async fn add_guids(
        &self,
        ex: &Exchange<'_>,
        key: PKey,
        membership: Membership,
        guids: &[Guid],
    ) -> Result<(), Failure> {
        let body = wire::AddGuids {
            pkey: pkey_text(key),
            guids: guids.iter().map(|g| guid_text(*g)).collect(),
            membership,
            index0: self.index0,
            ip_over_ib: self.ip_over_ib,
        };
        let body = serde_json::to_value(&body).expect("AddGuids serialises");
        let answer = ex
            .call(Method::POST, "/resources/pkeys", Some(&body))
            .await?;
        if answer.status.is_success() {
            Ok(())
        } else {
            Err(self.refusal(
                ex,
                &answer,
                &format!("adding {} GUID(s) to {key}", guids.len()),
            ))
        }
    }

    pub(super) async fn remove_guids(
        &self,
        ex: &Exchange<'_>,
        form: &mut RemovalForm,
        key: PKey,
        guids: &[Guid],
    ) -> Result<(), Failure> {
        let what = format!("removing {} GUID(s) from {key}", guids.len());
        if *form == RemovalForm::Action {
            let body = serde_json::to_value(wire::RemoveGuids {
                pkey: pkey_text(key),
                guids: guids.iter().map(|g| guid_text(*g)).collect(),
            })
            .expect("RemoveGuids serialises");
            let answer = ex
                .call(Method::POST, "/actions/remove_guids_from_pkey", Some(&body))
                .await?;
            match answer.status {
                s if s.is_success() => return Ok(()),
                // The deprecated action is gone (or the key vanished): the resource form decides.
                StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => {}
                _ => return Err(self.refusal(ex, &answer, &what)),
            }
        }
        let list: Vec<String> = guids.iter().map(|g| guid_text(*g)).collect();
        let path = format!(
            "/resources/pkeys/{}/guids/{}",
            pkey_text(key),
            list.join(",")
        );
        let answer = ex.call(Method::DELETE, &path, None).await?;
        match answer.status {
            s if s.is_success() => {
                if *form == RemovalForm::Action {
                    tracing::info!("UFM no longer offers remove_guids_from_pkey; using DELETE …/guids from now on");
                    *form = RemovalForm::Delete;
                }
                Ok(())
            }
            StatusCode::NOT_FOUND => Ok(()),
            _ => Err(self.refusal(ex, &answer, &what)),
        }
    }
}
