//! UFM's partition reads for [`UfmSm`]: the whole list, several keys (list or per key, under
//! the body cap), the change stamp, and one key.

use super::http::{Exchange, NoAnswer};
use super::wire::{self, pkey_text, PartitionState};
use super::{not_understood, Failure, PartitionReads, UfmError, UfmSm, READ_CONCURRENCY};
use crate::domain::PKey;
use futures::{StreamExt, TryStreamExt};
use reqwest::{Method, StatusCode};
use std::collections::{BTreeMap, BTreeSet};

impl UfmSm {
    pub(super) async fn read_all(
        &self,
        ex: &Exchange<'_>,
    ) -> Result<BTreeMap<PKey, PartitionState>, Failure> {
        let path = "/resources/pkeys?guids_data=true";
        let answer = ex.call(Method::GET, path, None).await?;
        if !answer.status.is_success() {
            return Err(self.refusal(ex, &answer, "listing partitions"));
        }
        wire::parse_all(&answer.body).map_err(|why| not_understood(path, why))
    }

    /// Reads `keys`: through the whole list when it is in use and `whole` is set or two or more
    /// keys are asked, else per key. Returns the keys' states and, when read, the whole list.
    /// A list answer over the body cap falls back to per-key reads, and once those work the
    /// list is not asked for again; any other failure of the list read is the apply's.
    pub(super) async fn read_many(
        &self,
        ex: &Exchange<'_>,
        list_usable: &mut bool,
        keys: &BTreeSet<PKey>,
        whole: bool,
    ) -> Result<PartitionReads, Failure> {
        let mut list_failure = None;
        if *list_usable && (whole || keys.len() >= 2) {
            match self.read_all(ex).await {
                Ok(all) => {
                    let picked = keys.iter().map(|k| (*k, all.get(k).cloned())).collect();
                    return Ok((picked, Some(all)));
                }
                Err(Failure::NoAnswer(UfmError::NoAnswer(why @ NoAnswer::TooLarge { .. }))) => {
                    list_failure = Some(why)
                }
                Err(other) => return Err(other),
            }
        }
        let picked = self.read_keys(ex, keys).await?;
        if let Some(why) = list_failure.filter(|_| !keys.is_empty()) {
            tracing::warn!(%why, "UFM's whole partition list cannot be read but single partitions can; reading per key from now on");
            *list_usable = false;
        }
        Ok((picked, None))
    }

    /// UFM's `last_updated` stamp; `None` when it gives none. A 4xx other than 401/403, or an
    /// answer that is not the stamp document, turns stamp reads off for this process.
    pub(super) async fn read_stamp(
        &self,
        ex: &Exchange<'_>,
        supported: &mut bool,
    ) -> Result<Option<String>, Failure> {
        let answer = ex
            .call(Method::GET, "/resources/pkeys/last_updated", None)
            .await?;
        let parsed = match answer.status {
            s if s.is_success() => wire::parse_last_updated(&answer.body),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                return Err(self.refusal(ex, &answer, "reading the partition stamp"))
            }
            _ => Err(()),
        };
        parsed.or_else(|()| {
            tracing::info!(status = %answer.status, "UFM gives no partition last_updated stamp; every re-check reads the partitions");
            *supported = false;
            Ok(None)
        })
    }

    pub(super) async fn read_keys(
        &self,
        ex: &Exchange<'_>,
        keys: &BTreeSet<PKey>,
    ) -> Result<BTreeMap<PKey, Option<PartitionState>>, Failure> {
        futures::stream::iter(keys.iter().copied())
            .map(|key| async move { self.read_key(ex, key).await.map(|p| (key, p)) })
            .buffered(READ_CONCURRENCY)
            .try_collect()
            .await
    }

    pub(super) async fn read_key(
        &self,
        ex: &Exchange<'_>,
        key: PKey,
    ) -> Result<Option<PartitionState>, Failure> {
        let path = format!("/resources/pkeys/{}?guids_data=true", pkey_text(key));
        let answer = ex.call(Method::GET, &path, None).await?;
        match answer.status {
            StatusCode::NOT_FOUND => Ok(None),
            s if s.is_success() => {
                wire::parse_partition(&answer.body).map_err(|why| not_understood(&path, why))
            }
            _ => Err(self.refusal(ex, &answer, &format!("reading {key}"))),
        }
    }
}
