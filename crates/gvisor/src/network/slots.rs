//! Network slots: a sandbox's place on the host network. Slot `s` owns the /30 link
//! `10.77.0.0 + 4s` (the host's end, then the sandbox's address) and the host device `alv{s}`.
//!
//! Slots are handed out round-robin, so an address comes back only after every other slot was
//! used: connections to a dead sandbox can outlive it on the host, and nothing should find a
//! new sandbox at a recently used address. The cursor is kept in a file, so a restart goes on
//! where the last run stopped instead of starting over at the first address.

use airlock_core::driver::DriverError;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Mutex;

/// The addresses that belong to a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SlotAddrs {
    /// The host's end of the link (the sandbox's default gateway).
    pub host: Ipv4Addr,
    /// The sandbox's own address; the agent listens here.
    pub sandbox: Ipv4Addr,
}

impl SlotAddrs {
    /// Slots map onto /30 links inside 10.77.0.0/16.
    pub const MAX_SLOTS: u32 = 1 << 14;

    pub fn for_slot(slot: u32) -> Self {
        assert!(slot < Self::MAX_SLOTS, "slot {slot} out of range");
        let base = u32::from(Ipv4Addr::new(10, 77, 0, 0)) + slot * 4;
        SlotAddrs {
            host: Ipv4Addr::from(base + 1),
            sandbox: Ipv4Addr::from(base + 2),
        }
    }
}

/// Which slots are taken, and where the round-robin search goes on.
pub(crate) struct Slots {
    inner: Mutex<Inner>,
    cursor_file: PathBuf,
}

struct Inner {
    used: Vec<bool>,
    next: u32,
}

impl Slots {
    /// Reads the cursor the last run left in `cursor_file`, if any.
    pub fn new(cursor_file: PathBuf) -> Self {
        let next = std::fs::read_to_string(&cursor_file)
            .ok()
            .and_then(|s| s.trim().parse::<u32>().ok())
            .filter(|n| *n < SlotAddrs::MAX_SLOTS)
            .unwrap_or(0);
        Slots {
            inner: Mutex::new(Inner {
                used: vec![false; SlotAddrs::MAX_SLOTS as usize],
                next,
            }),
            cursor_file,
        }
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the next free slot after the cursor.
    pub fn take(&self) -> Result<u32, DriverError> {
        let mut inner = self.inner();
        let total = SlotAddrs::MAX_SLOTS;
        let start = inner.next;
        let slot = (0..total)
            .map(|i| (start + i) % total)
            .find(|&s| !inner.used[s as usize])
            .ok_or_else(|| DriverError::Command {
                what: "finding a network slot".into(),
                detail: format!("all {total} are in use"),
            })?;
        inner.used[slot as usize] = true;
        inner.next = (slot + 1) % total;
        // Best effort: a lost cursor only means the next run starts over at the first slot.
        if let Err(e) = std::fs::write(&self.cursor_file, inner.next.to_string()) {
            tracing::warn!(error = %e, "saving the network slot cursor failed");
        }
        Ok(slot)
    }

    /// Marks `slot` taken (a sandbox adopted after a restart). Out of range: ignored.
    pub fn mark_taken(&self, slot: u32) {
        if let Some(used) = self.inner().used.get_mut(slot as usize) {
            *used = true;
        }
    }

    pub fn free(&self, slot: u32) {
        if let Some(used) = self.inner().used.get_mut(slot as usize) {
            *used = false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_do_not_overlap() {
        let a = SlotAddrs::for_slot(0);
        let b = SlotAddrs::for_slot(1);
        assert_eq!(a.host, Ipv4Addr::new(10, 77, 0, 1));
        assert_eq!(a.sandbox, Ipv4Addr::new(10, 77, 0, 2));
        assert_eq!(b.host, Ipv4Addr::new(10, 77, 0, 5));
        let last = SlotAddrs::for_slot(SlotAddrs::MAX_SLOTS - 1);
        assert_eq!(last.sandbox, Ipv4Addr::new(10, 77, 255, 254));
    }

    #[test]
    fn round_robin_goes_on_after_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("cursor");
        let slots = Slots::new(file.clone());
        assert_eq!((slots.take().unwrap(), slots.take().unwrap()), (0, 1));
        slots.free(0);
        assert_eq!(
            slots.take().unwrap(),
            2,
            "a freed slot is not reused at once"
        );
        drop(slots);
        let again = Slots::new(file);
        again.mark_taken(1);
        assert_eq!(
            again.take().unwrap(),
            3,
            "the next run goes on where this one stopped"
        );
    }
}
