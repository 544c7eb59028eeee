//! Signals during training: the first SIGINT, SIGTERM or SIGHUP asks the loop to stop
//! with a checkpoint; a second one ends the process at once. `lethe bench` watches the
//! same way, and its loops ask [`stop_requested`] at every step, so that one signal
//! stops any count of steps, however large.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

/// The signal received while any [`Signals`] watched (0: none), for [`stop_requested`].
fn received_flag() -> &'static Arc<AtomicUsize> {
    static RECEIVED: OnceLock<Arc<AtomicUsize>> = OnceLock::new();
    RECEIVED.get_or_init(|| Arc::new(AtomicUsize::new(0)))
}

/// The name of the signal received since the watching [`Signals`] started, if any: for
/// loops deep inside a command that cannot be handed the watcher.
pub fn stop_requested() -> Option<String> {
    name_of(received_flag().load(Ordering::SeqCst) as i32)
}

fn name_of(signal: i32) -> Option<String> {
    Signals::WATCHED.iter().find(|(s, _)| *s == signal).map(|(_, name)| name.to_string())
}

/// The first of SIGINT, SIGTERM and SIGHUP received while watching; a second one ends
/// the process at once (exit status 128 + the signal's number). The handlers are
/// removed when this value is dropped.
pub struct Signals {
    ids: Vec<signal_hook::SigId>,
}

impl Signals {
    const WATCHED: [(i32, &'static str); 3] = [
        (signal_hook::consts::SIGINT, "SIGINT"),
        (signal_hook::consts::SIGTERM, "SIGTERM"),
        (signal_hook::consts::SIGHUP, "SIGHUP"),
    ];

    pub fn watch() -> lethe_core::error::Result<Signals> {
        Self::register().map_err(|e| lethe_core::error::LetheError::Invalid(format!("cannot watch for signals: {e}")))
    }

    fn register() -> std::io::Result<Signals> {
        use std::sync::atomic::AtomicBool;
        let seen = Arc::new(AtomicBool::new(false));
        let received = received_flag();
        received.store(0, Ordering::SeqCst);
        let mut ids = vec![];
        for (signal, _) in Self::WATCHED {
            // Order matters: the shutdown acts only if an earlier signal set `seen`.
            ids.push(signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, Arc::clone(&seen))?);
            ids.push(signal_hook::flag::register(signal, Arc::clone(&seen))?);
            ids.push(signal_hook::flag::register_usize(signal, Arc::clone(received), signal as usize)?);
        }
        Ok(Signals { ids })
    }

    /// The name of the signal received, if any.
    pub fn received(&self) -> Option<String> {
        stop_requested()
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        received_flag().store(0, Ordering::SeqCst);
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
