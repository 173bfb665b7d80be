//! Where the backends run their blocking file and store I/O: on tokio's blocking threads, so
//! the runtime's other tasks keep running, or inline on the calling task for the duration of
//! [`inline_blocking_io`].
//!
//! The inline form is for a deterministic simulation: one current-thread runtime with paused
//! time, whose stores are in memory and whose files are on tmpfs. A blocking thread beside that
//! runtime finishes at a moment real time decides: its completion wakes the waiting task from
//! outside, at whatever point of the runtime's run queue the machine's load makes it, and a
//! seed stops replaying exactly (other tasks of the same simulated instant draw from the same
//! random stream before or after it). Production never calls [`inline_blocking_io`].

use std::cell::Cell;

thread_local! {
    /// Set while [`inline_blocking_io`] runs on this thread.
    static INLINE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` (typically a current-thread runtime's `block_on`) with every blocking call of the
/// backends made from this thread run inline instead of on a blocking thread. The previous
/// setting is restored when `f` returns or unwinds.
pub fn inline_blocking_io<R>(f: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            INLINE.set(self.0);
        }
    }
    let _restore = Restore(INLINE.replace(true));
    f()
}

/// Runs the blocking `f` on a blocking thread (`spawn_blocking`), or inline inside
/// [`inline_blocking_io`]. The error is the blocking task's panic or cancellation (inline, a
/// panic unwinds the caller instead).
pub(crate) async fn unblock<T, F>(f: F) -> Result<T, tokio::task::JoinError>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    if INLINE.get() {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn runs_on_a_blocking_thread_unless_inline() {
        let here = std::thread::current().id();
        let away = unblock(|| std::thread::current().id()).await.unwrap();
        assert_ne!(away, here, "spawn_blocking runs on another thread");
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let (inline, caller) = std::thread::spawn(move || {
            let caller = std::thread::current().id();
            let inline = inline_blocking_io(|| {
                rt.block_on(unblock(|| std::thread::current().id()))
                    .unwrap()
            });
            (inline, caller)
        })
        .join()
        .unwrap();
        assert_eq!(inline, caller, "inline runs on the runtime's own thread");
        assert!(!INLINE.get(), "the setting does not leak to other threads");
    }

    #[test]
    fn the_setting_is_restored_after_a_panic() {
        let r = std::panic::catch_unwind(|| inline_blocking_io(|| panic!("inside")));
        assert!(r.is_err());
        assert!(!INLINE.get());
    }
}
