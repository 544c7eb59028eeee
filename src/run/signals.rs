//! Signals during training: the first SIGINT, SIGTERM or SIGHUP asks the loop to stop
//! with a checkpoint; a second one ends the process at once. `lethe bench` watches the
//! same way and stops between configs.

/// The first of SIGINT, SIGTERM and SIGHUP received while watching; a second one ends
/// the process at once (exit status 128 + the signal's number). The handlers are
/// removed when this value is dropped.
pub(crate) struct Signals {
    received: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    ids: Vec<signal_hook::SigId>,
}

impl Signals {
    const WATCHED: [(i32, &'static str); 3] =
        [(signal_hook::consts::SIGINT, "SIGINT"), (signal_hook::consts::SIGTERM, "SIGTERM"), (signal_hook::consts::SIGHUP, "SIGHUP")];

    pub(crate) fn watch() -> crate::error::Result<Signals> {
        Self::register().map_err(|e| crate::error::LetheError::Invalid(format!("cannot watch for signals: {e}")))
    }

    fn register() -> std::io::Result<Signals> {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        use std::sync::Arc;
        let (seen, received) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let mut ids = vec![];
        for (signal, _) in Self::WATCHED {
            // Order matters: the shutdown acts only if an earlier signal set `seen`.
            ids.push(signal_hook::flag::register_conditional_shutdown(signal, 128 + signal, Arc::clone(&seen))?);
            ids.push(signal_hook::flag::register(signal, Arc::clone(&seen))?);
            ids.push(signal_hook::flag::register_usize(signal, Arc::clone(&received), signal as usize)?);
        }
        Ok(Signals { received, ids })
    }

    /// The name of the signal received, if any.
    pub(crate) fn received(&self) -> Option<String> {
        let signal = self.received.load(std::sync::atomic::Ordering::SeqCst) as i32;
        Self::WATCHED.iter().find(|(s, _)| *s == signal).map(|(_, name)| name.to_string())
    }
}

impl Drop for Signals {
    fn drop(&mut self) {
        for id in self.ids.drain(..) {
            signal_hook::low_level::unregister(id);
        }
    }
}
