//! Every connection the process serves, across all its listeners, oldest first: the budget the
//! file-descriptor limit allows, and which connection gives way when it is spent.
//!
//! A connection is *idle* while no request is in progress on it — it has connected and not yet
//! sent a whole request head, or it is kept alive between requests — and *busy* from a request
//! head to the end of its answer. When a listener (or the process) has no slot left, the oldest
//! idle connection is shed to admit the new one: a flood of silent or trickling clients ages out
//! under newer ones instead of making every new client wait for a deadline, and a request in
//! progress is never cut.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU8, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Notify;

/// No request in progress on the connection.
pub(crate) const IDLE: u8 = 0;
/// A request head arrived; its answer is not yet sent.
pub(crate) const BUSY: u8 = 1;
/// Chosen to give way; its task drops it.
pub(crate) const SHED: u8 = 2;

struct Open {
    listener: u64,
    state: Arc<AtomicU8>,
    shed: Arc<Notify>,
}

pub(crate) struct Registry {
    /// Every connection but those told to give way (counted in `shedding` until their task
    /// has closed them): a flood's shed connections are not scanned again and again.
    open: Mutex<BTreeMap<u64, Open>>,
    next: AtomicU64,
    /// Signalled whenever a connection ends: an accept loop waiting for a slot looks again.
    pub(crate) freed: Notify,
    /// Connections the whole process may hold.
    pub(crate) cap: usize,
    /// Connections told to give way, not yet gone, that may be open beyond `cap`.
    overshoot: usize,
    /// Connections told to give way that have not gone yet.
    shedding: AtomicUsize,
    shed_count: AtomicU64,
    last_warned: Mutex<Option<std::time::Instant>>,
}

/// One admitted connection; dropping it frees the slot.
pub(crate) struct Slot {
    id: u64,
    listener_open: Arc<AtomicUsize>,
    pub(crate) state: Arc<AtomicU8>,
    pub(crate) shed: Arc<Notify>,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let reg = registry();
        let mut open = reg.open.lock().unwrap_or_else(|p| p.into_inner());
        // Gone from the map already if it was shed (and counted in `shedding` since).
        if open.remove(&self.id).is_none() {
            reg.shedding.fetch_sub(1, Ordering::Relaxed);
        }
        self.listener_open.fetch_sub(1, Ordering::Relaxed);
        drop(open);
        reg.freed.notify_waiters();
    }
}

/// What [`Registry::admit`] did when there was no slot.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Full {
    /// The oldest idle connection was told to give way: look again once it has gone.
    Shed,
    /// Every connection is busy (a request in progress on each): wait for one to end.
    AllBusy,
}

impl Registry {
    /// A slot for a new connection of `listener` (which holds `listener_open` of at most
    /// `listener_cap`); when there is none, the oldest idle connection is shed — the
    /// listener's own when it is the one that is full, else the process's.
    pub(crate) fn admit(
        &self,
        listener: u64,
        listener_open: &Arc<AtomicUsize>,
        listener_cap: usize,
    ) -> Result<Slot, Full> {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        if listener_open.load(Ordering::Relaxed) >= listener_cap.max(1) {
            // This listener's own cap: its oldest idle connection goes first, then the new one
            // comes in (rare: listeners are capped by the process's budget unless a caller asks).
            if self.shedding.load(Ordering::Relaxed) > 0 {
                return Err(Full::Shed);
            }
            let shed = self.shed_first(&mut open, |c| c.listener == listener);
            return Err(if shed { Full::Shed } else { Full::AllBusy });
        }
        // The process's budget counts connections told to give way as gone: their descriptors
        // close in a moment, and a new client need not wait for that. Up to `overshoot` of them
        // at once (the reserve of descriptors covers them); beyond, wait until some have gone.
        let shedding = self.shedding.load(Ordering::Relaxed);
        if open.len() >= self.cap {
            if shedding >= self.overshoot {
                return Err(Full::Shed);
            }
            if !self.shed_first(&mut open, |_| true) {
                return Err(Full::AllBusy);
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let (state, shed) = (Arc::new(AtomicU8::new(IDLE)), Arc::new(Notify::new()));
        open.insert(id, Open { listener, state: state.clone(), shed: shed.clone() });
        listener_open.fetch_add(1, Ordering::Relaxed);
        Ok(Slot { id, listener_open: listener_open.clone(), state, shed })
    }

    /// Sheds the process's oldest idle connection (the process ran out of file descriptors);
    /// false when every connection is busy.
    pub(crate) fn shed_oldest(&self) -> bool {
        let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
        self.shedding.load(Ordering::Relaxed) > 0 || self.shed_first(&mut open, |_| true)
    }

    /// Tells the oldest idle connection that `eligible` allows to give way; false if none is.
    /// Called with the registry locked (`open`), as a slot's drop counts it out.
    fn shed_first(&self, open: &mut BTreeMap<u64, Open>, eligible: impl Fn(&Open) -> bool) -> bool {
        let victim = open.iter().find(|(_, c)| {
            eligible(c) && c.state.compare_exchange(IDLE, SHED, Ordering::AcqRel, Ordering::Relaxed).is_ok()
        });
        let Some(id) = victim.map(|(id, _)| *id) else { return false };
        let c = open.remove(&id).expect("found above");
        c.shed.notify_one();
        self.shedding.fetch_add(1, Ordering::Relaxed);
        self.note_shed();
        true
    }

    /// Says, at most every 10 s, how many idle connections gave way: a flood is visible in the
    /// log without one line per connection.
    fn note_shed(&self) {
        let n = self.shed_count.fetch_add(1, Ordering::Relaxed) + 1;
        let mut last = self.last_warned.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(10)) {
            *last = Some(std::time::Instant::now());
            tracing::warn!(
                shed = n,
                cap = self.cap,
                "connection slots spent: the oldest idle connections (no request in progress) gave way to new ones"
            );
        }
    }
}

/// The process's registry; the first use raises the file-descriptor limit and sizes the budget.
pub(crate) fn registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(|| {
        let (before, now) = raise_fd_limit();
        let cap = connection_cap(now);
        tracing::info!(
            fd_limit = now,
            fd_limit_before = before,
            connections = cap,
            "connection budget sized from the file-descriptor limit"
        );
        Registry {
            open: Mutex::new(BTreeMap::new()),
            next: AtomicU64::new(0),
            freed: Notify::new(),
            cap,
            overshoot: ((now as usize).saturating_sub(cap) / 2).clamp(1, 4096),
            shedding: AtomicUsize::new(0),
            shed_count: AtomicU64::new(0),
            last_warned: Mutex::new(None),
        }
    })
}

/// Connections a process whose descriptor limit is `fds` may hold: the rest stays for its
/// store, data files, logs and outgoing connections (a tenth, at least 256), and no more than
/// 100,000 whatever the limit (each costs a task and socket buffers).
pub(crate) fn connection_cap(fds: u64) -> usize {
    let reserve = (fds / 10).max(256);
    fds.saturating_sub(reserve).clamp(64, 100_000) as usize
}

/// Raises the soft limit on open files to the hard limit (what the system allows this process
/// without privileges); returns the soft limit before and after.
fn raise_fd_limit() -> (u64, u64) {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let lim = getrlimit(Resource::Nofile);
    let before = lim.current.unwrap_or(u64::MAX);
    let Some(max) = lim.maximum else {
        return (before, before);
    };
    if before >= max {
        return (before, before);
    }
    match setrlimit(Resource::Nofile, Rlimit { current: Some(max), maximum: Some(max) }) {
        Ok(()) => (before, max),
        Err(e) => {
            tracing::warn!(error = %e, limit = before, "could not raise the open-file limit");
            (before, before)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_leaves_room_for_the_rest_of_the_process() {
        assert_eq!(connection_cap(1024), 768);
        assert_eq!(connection_cap(20_000), 18_000);
        assert_eq!(connection_cap(100), 64);
        assert_eq!(connection_cap(1 << 30), 100_000);
    }

    #[tokio::test]
    async fn the_oldest_idle_connection_gives_way_and_a_busy_one_never_does() {
        let reg = registry();
        let open = Arc::new(AtomicUsize::new(0));
        let a = reg.admit(7, &open, 2).unwrap();
        let b = reg.admit(7, &open, 2).unwrap();
        a.state.store(BUSY, Ordering::Relaxed);
        // Full: b (idle) gives way, not a (busy, and older).
        assert_eq!(reg.admit(7, &open, 2).err(), Some(Full::Shed));
        assert_eq!(b.state.load(Ordering::Relaxed), SHED);
        assert_eq!(a.state.load(Ordering::Relaxed), BUSY);
        // b has not gone yet: wait for it rather than shed more.
        assert_eq!(reg.admit(7, &open, 2).err(), Some(Full::Shed));
        drop(b);
        let c = reg.admit(7, &open, 2).unwrap();
        c.state.store(BUSY, Ordering::Relaxed);
        assert_eq!(reg.admit(7, &open, 2).err(), Some(Full::AllBusy), "nothing idle to shed");
        c.state.store(IDLE, Ordering::Relaxed);
        // Another listener's connections are not this listener's to shed.
        let other = Arc::new(AtomicUsize::new(0));
        let d = reg.admit(8, &other, 1).unwrap();
        assert_eq!(reg.admit(8, &other, 1).err(), Some(Full::Shed));
        assert_eq!(d.state.load(Ordering::Relaxed), SHED);
        assert_eq!(c.state.load(Ordering::Relaxed), IDLE);
        drop((a, c, d));
        assert_eq!(reg.shedding.load(Ordering::Relaxed), 0);
        assert_eq!(open.load(Ordering::Relaxed), 0);
    }
}
