//! What netd knows of each sandbox, by its address: its policy, the addresses its DNS answered
//! for allowed domains, its share of netd's budgets, and its proxied connections (so that a
//! policy change can cut those the new policy forbids).
//!
//! A sandbox netd has not been told about gets nothing: no answers, no connections.

use airlock_wire::egress::Egress;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

/// DNS queries one sandbox may have in flight; more are dropped (clients retry).
pub const DNS_PER_SANDBOX: usize = 16;
/// Proxied connections one sandbox may hold; more are refused.
pub const CONNECTIONS_PER_SANDBOX: usize = 256;
/// Learned addresses kept per sandbox; the oldest go first.
const MAX_LEARNED: usize = 4096;
/// Addresses learned from DNS stay usable at least this long, so a client that caches an answer
/// beyond its TTL is not cut off mid-session...
const MIN_LEARNED: Duration = Duration::from_secs(3600);
/// ... and at most this long.
const MAX_LEARNED_TTL: Duration = Duration::from_secs(24 * 3600);

/// One sandbox's state.
pub struct Sandbox {
    egress: RwLock<Arc<Egress>>,
    /// Address → when it stops being usable.
    learned: Mutex<HashMap<Ipv4Addr, Instant>>,
    dns: Arc<Semaphore>,
    connections: Arc<Semaphore>,
    relays: Mutex<Vec<Relay>>,
    /// Cut when the sandbox is gone.
    gone: CancellationToken,
}

/// A proxied connection, as far as a policy change needs to know it.
struct Relay {
    id: u64,
    /// The name it was let through for; `None` for a protocol that names nothing.
    name: Option<String>,
    dialled: Ipv4Addr,
    cut: CancellationToken,
}

/// Removes its relay from the table when the connection ends.
pub struct RelayGuard {
    sandbox: Arc<Sandbox>,
    id: u64,
    pub cut: CancellationToken,
}

impl Drop for RelayGuard {
    fn drop(&mut self) {
        lock(&self.sandbox.relays).retain(|r| r.id != self.id);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

static RELAY_IDS: AtomicU64 = AtomicU64::new(0);

impl Sandbox {
    fn new(egress: Egress) -> Arc<Self> {
        Arc::new(Sandbox {
            egress: RwLock::new(Arc::new(egress)),
            learned: Mutex::default(),
            dns: Arc::new(Semaphore::new(DNS_PER_SANDBOX)),
            connections: Arc::new(Semaphore::new(CONNECTIONS_PER_SANDBOX)),
            relays: Mutex::default(),
            gone: CancellationToken::new(),
        })
    }

    pub fn egress(&self) -> Arc<Egress> {
        self.egress
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A slot for one DNS query, if the sandbox has one free.
    pub fn dns_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.dns.clone().try_acquire_owned().ok()
    }

    /// A slot for one connection to the proxy, from its accept to its end, if the sandbox has
    /// one free.
    pub fn connection_permit(&self) -> Option<OwnedSemaphorePermit> {
        self.connections.clone().try_acquire_owned().ok()
    }

    /// Resolves when the sandbox is gone.
    pub async fn gone(&self) {
        self.gone.cancelled().await
    }

    /// Registers a proxied connection that was let through, so that a policy change can cut
    /// it. `name` is what it was let through for (`None`: an address its DNS answered, for a
    /// protocol naming nothing).
    pub fn relay(self: &Arc<Self>, name: Option<String>, dialled: Ipv4Addr) -> RelayGuard {
        let id = RELAY_IDS.fetch_add(1, Ordering::Relaxed);
        let cut = self.gone.child_token();
        lock(&self.relays).push(Relay {
            id,
            name,
            dialled,
            cut: cut.clone(),
        });
        RelayGuard {
            sandbox: self.clone(),
            id,
            cut,
        }
    }

    /// Remembers addresses DNS answered for an allowed domain, each for its TTL (clamped).
    pub fn learn(&self, addrs: &[(Ipv4Addr, u32)]) {
        let now = Instant::now();
        let mut learned = lock(&self.learned);
        for (ip, ttl) in addrs {
            let ttl = Duration::from_secs(u64::from(*ttl)).clamp(MIN_LEARNED, MAX_LEARNED_TTL);
            learned.insert(*ip, now + ttl);
        }
        if learned.len() > MAX_LEARNED {
            learned.retain(|_, until| *until > now);
            while learned.len() > MAX_LEARNED {
                let oldest = learned
                    .iter()
                    .min_by_key(|(_, until)| **until)
                    .map(|(ip, _)| *ip);
                match oldest {
                    Some(ip) => learned.remove(&ip),
                    None => break,
                };
            }
        }
    }

    /// Whether DNS answered `ip` for one of the sandbox's allowed domains, and it still counts.
    pub fn learned(&self, ip: Ipv4Addr) -> bool {
        lock(&self.learned)
            .get(&ip)
            .is_some_and(|until| *until > Instant::now())
    }

    /// Replaces the policy: learned addresses are forgotten, and proxied connections the new
    /// policy would not let through are cut.
    fn replace(&self, egress: Egress) {
        lock(&self.learned).clear();
        for relay in lock(&self.relays).iter() {
            let by_name = relay
                .name
                .as_deref()
                .is_some_and(|name| egress.allows_domain(name));
            if !by_name && !egress.allows_addr(relay.dialled) {
                relay.cut.cancel();
            }
        }
        *self.egress.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(egress);
    }
}

/// Every sandbox netd knows, by address.
#[derive(Default)]
pub struct Sandboxes(RwLock<HashMap<Ipv4Addr, Arc<Sandbox>>>);

impl Sandboxes {
    pub fn get(&self, addr: Ipv4Addr) -> Option<Arc<Sandbox>> {
        self.0
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&addr)
            .cloned()
    }

    pub fn set(&self, addr: Ipv4Addr, egress: Egress) {
        let mut all = self.0.write().unwrap_or_else(|e| e.into_inner());
        match all.get(&addr) {
            Some(sandbox) => sandbox.replace(egress),
            None => {
                all.insert(addr, Sandbox::new(egress));
            }
        }
    }

    pub fn clear(&self, addr: Ipv4Addr) {
        let removed = self
            .0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&addr);
        if let Some(sandbox) = removed {
            sandbox.gone.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(allow: &[&str]) -> Egress {
        let allow: Vec<String> = allow.iter().map(|s| s.to_string()).collect();
        Egress::from_request(Some(false), &allow, &[]).unwrap()
    }

    #[test]
    fn a_new_policy_forgets_and_cuts_what_it_forbids() {
        let all = Sandboxes::default();
        let addr = Ipv4Addr::new(10, 77, 0, 2);
        all.set(addr, policy(&["a.example", "b.example"]));
        let sandbox = all.get(addr).unwrap();
        let target = Ipv4Addr::new(203, 0, 113, 9);
        sandbox.learn(&[(target, 30)]);
        assert!(sandbox.learned(target));
        let a = sandbox.relay(Some("a.example".into()), target);
        let b = sandbox.relay(Some("b.example".into()), target);
        let unnamed = sandbox.relay(None, target);

        all.set(addr, policy(&["a.example"]));
        assert!(!sandbox.learned(target), "learned addresses are forgotten");
        assert!(!a.cut.is_cancelled());
        assert!(b.cut.is_cancelled() && unnamed.cut.is_cancelled());
        drop(b);
        assert_eq!(lock(&sandbox.relays).len(), 2);

        all.clear(addr);
        assert!(
            a.cut.is_cancelled(),
            "a sandbox that is gone loses everything"
        );
        assert!(all.get(addr).is_none());
    }

    #[test]
    fn budgets_are_per_sandbox() {
        let all = Sandboxes::default();
        let (one, two) = (Ipv4Addr::new(10, 77, 0, 2), Ipv4Addr::new(10, 77, 0, 6));
        all.set(one, Egress::default());
        all.set(two, Egress::default());
        let first = all.get(one).unwrap();
        let held: Vec<_> = (0..DNS_PER_SANDBOX)
            .map(|_| first.dns_permit().unwrap())
            .collect();
        assert!(first.dns_permit().is_none());
        assert!(
            all.get(two).unwrap().dns_permit().is_some(),
            "the neighbour is unaffected"
        );
        drop(held);
        assert!(first.dns_permit().is_some());
        let held: Vec<_> = (0..CONNECTIONS_PER_SANDBOX)
            .map(|_| first.connection_permit().unwrap())
            .collect();
        assert!(first.connection_permit().is_none());
        assert!(all.get(two).unwrap().connection_permit().is_some());
        drop(held);
    }
}
