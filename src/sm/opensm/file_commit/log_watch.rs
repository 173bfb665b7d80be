//! The log watch: OpenSM's log read on a timer for rejections the agent did not cause (an
//! operator's edit, one logged while the agent was down), each repaired with a commit.

use super::FileCommitter;
use crate::sm::opensm::error::OpenSmError;
use std::sync::Weak;
use std::time::Duration;

/// Looks at OpenSM's log every `every` (the first time after `first`) for rejections the agent
/// did not cause, and repairs them with a commit (`resync`: `None` once the backend is gone);
/// also retries a repair that was not confirmed and confirms an operator's new edit after a
/// rejected one. Ends when the committer or the backend is dropped.
pub(in crate::sm::opensm) async fn watch_log<F, Fut>(
    files: Weak<FileCommitter>,
    first: Duration,
    every: Duration,
    resync: F,
) where
    F: Fn() -> Option<Fut>,
    Fut: std::future::Future<Output = Result<(), OpenSmError>>,
{
    let mut scanned = 0u64;
    let mut wait = first;
    let mut at_start = first.is_zero();
    loop {
        tokio::time::sleep(wait).await;
        wait = every;
        let Some(files) = files.upgrade() else {
            return;
        };
        let mark = files.health().log_mark;
        let (errors, end) = files.reloader.rejections_since(scanned.max(mark));
        scanned = end;
        let start = std::mem::take(&mut at_start);
        if let Err(e) = files.operator_parts().await {
            tracing::warn!(error = %e, "operator file check");
        }
        if !errors.is_empty() || start || files.needs_repair().await {
            drop(files);
            let Some(commit) = resync() else {
                return;
            };
            if let Err(e) = commit.await {
                tracing::warn!(error = %e, "repair after a rejected partitions file");
            }
        }
    }
}
