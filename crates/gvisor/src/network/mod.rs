//! The network plan: the one owner of everything a sandbox's networking is made of. Nothing
//! outside it computes an address.
//!
//! - [`slots`]: which slot (and so which /30 link and addresses) each sandbox has;
//! - [`links`]: its network namespace and veth pair;
//! - [`firewall`]: what may cross the link, per packet;
//! - `services`: `airlock-netd`, the DNS forwarder and domain proxy in a process of their own;
//! - `forwarding`: the host's forwarding switch.
//!
//! A sandbox is attached before it runs (link, rules, netd told its policy) and detached after
//! it is gone (the same, undone, and the host's sockets to its address destroyed), and only
//! then is its slot free again.

pub(crate) mod firewall;
mod forwarding;
pub(crate) mod links;
mod services;
pub(crate) mod slots;

use airlock_core::driver::DriverError;
use airlock_core::egress::{Egress, Ipv4Net};
use firewall::{Firewall, Install, DNS_PORT, PROXY_PORT};
use services::Services;
use slots::{SlotAddrs, Slots};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

const RESOLV_CONF: &str = "/etc/resolv.conf";

/// What the network plan starts with.
pub(crate) struct Setup<'a> {
    /// Where the slot cursor is kept.
    pub state_dir: &'a Path,
    /// Where the record of the forwarding switch is kept (the instance's run dir).
    pub run_dir: PathBuf,
    /// `false` only for the escape suite's isolation-off run (see [`firewall::Install`]).
    pub enforce: bool,
    pub netd_binary: PathBuf,
    /// Sandboxes a restart will adopt: their slots and policies are in force from the start.
    pub known: &'a [(u32, Egress)],
}

pub(crate) struct Network {
    slots: Slots,
    firewall: Firewall,
    services: Services,
    /// What no sandbox may reach (see [`firewall::deny_set`]).
    deny: Vec<Ipv4Net>,
    run_dir: PathBuf,
}

impl Network {
    /// Turns forwarding on, installs the firewall with every known sandbox in it, and starts
    /// the network services. Must run inside the async runtime.
    pub fn new(setup: Setup<'_>) -> Result<Self, DriverError> {
        let forwarding_was_on = forwarding::enable(&setup.run_dir)?;
        let deny = firewall::deny_set(firewall::host_networks()?);
        let resolv_conf = std::fs::read_to_string(RESOLV_CONF).unwrap_or_default();
        let (upstreams, search) = airlock_netd::dns::read_resolv_conf(&resolv_conf);
        let resolvers: Vec<IpAddr> = upstreams.iter().map(|a| a.ip()).collect();
        let (uid, gid) = services::service_user()?;
        let installing = std::time::Instant::now();
        let firewall = Firewall::install(&Install {
            enforce: setup.enforce,
            forwarding_was_on,
            deny: &deny,
            resolvers: &resolvers,
            netd_uid: uid,
            known: setup.known,
        })?;
        tracing::info!(
            sandboxes = setup.known.len(),
            elapsed = ?installing.elapsed(),
            "host firewall installed, with the rules of every sandbox to adopt"
        );
        let slots = Slots::new(setup.state_dir.join("slot-cursor"));
        for (slot, _) in setup.known {
            slots.mark_taken(*slot);
        }
        let bind =
            |what: &str, port: u16| DriverError::io(format!("listening for {what} on port {port}"));
        let dns = std::net::UdpSocket::bind((Ipv4Addr::UNSPECIFIED, DNS_PORT))
            .map_err(bind("sandbox DNS", DNS_PORT))?;
        let proxy = std::net::TcpListener::bind((Ipv4Addr::UNSPECIFIED, PROXY_PORT))
            .map_err(bind("the domain proxy", PROXY_PORT))?;
        let known: Vec<(Ipv4Addr, Egress)> = setup
            .known
            .iter()
            .map(|(slot, egress)| (SlotAddrs::for_slot(*slot).sandbox, egress.clone()))
            .collect();
        let services = Services::start(
            services::Config {
                binary: setup.netd_binary,
                deny: deny.clone(),
                upstreams,
                search,
                dns,
                proxy,
            },
            uid,
            gid,
            &known,
        );
        Ok(Network {
            slots,
            firewall,
            services,
            deny,
            run_dir: setup.run_dir,
        })
    }

    /// What no sandbox may reach: the platform's ranges and the host's own networks.
    pub fn unreachable(&self) -> &[Ipv4Net] {
        &self.deny
    }

    /// A free slot for a new sandbox.
    pub fn allocate(&self) -> Result<u32, DriverError> {
        self.slots.take()
    }

    /// Takes `slot` for a sandbox adopted after a restart.
    pub fn adopt(&self, slot: u32) {
        self.slots.mark_taken(slot);
    }

    pub fn addrs(slot: u32) -> SlotAddrs {
        SlotAddrs::for_slot(slot)
    }

    /// Makes the sandbox's link (its end in the netns named `netns`) and puts `egress` in force,
    /// all before the sandbox runs.
    pub async fn attach(&self, netns: &str, slot: u32, egress: &Egress) -> Result<(), DriverError> {
        links::setup(netns, slot).await?;
        self.set_egress(slot, egress).await
    }

    /// Replaces the policy of the sandbox in `slot`: in the firewall (which judges every packet,
    /// so it holds at once) and in netd (which cuts proxied connections it forbids).
    pub async fn set_egress(&self, slot: u32, egress: &Egress) -> Result<(), DriverError> {
        self.firewall.apply(slot, egress).await?;
        self.services
            .set(SlotAddrs::for_slot(slot).sandbox, egress)
            .await;
        Ok(())
    }

    /// Undoes [`Network::attach`] once the sandbox is gone (or for what a failed start left),
    /// destroys the host's sockets and flows to its address, and frees the slot. Keeps going
    /// after an error and returns the first.
    pub async fn detach(&self, netns: &str, slot: Option<u32>) -> Result<(), DriverError> {
        let mut result = Ok(());
        // The link before the netns: deleting it removes both veth ends at once, whereas a
        // deleted netns lets go of its devices asynchronously, and a launch reusing the slot
        // right away would still find `alv{slot}`.
        if let Some(slot) = slot {
            result = result.and(links::delete_link(slot).await);
            result = result.and(self.firewall.clear(slot).await);
            let addr = SlotAddrs::for_slot(slot).sandbox;
            self.services.clear(addr).await;
            result = result.and(links::forget_address(addr).await);
        }
        result = result.and(links::delete_netns(netns).await);
        if let (Some(slot), Ok(())) = (slot, &result) {
            self.slots.free(slot);
        }
        result
    }

    /// Removes a link no sandbox holds (left over by a crashed server), and the host's sockets
    /// and flows to its address.
    pub async fn forget_slot(&self, slot: u32) -> Result<(), DriverError> {
        let deleted = links::delete_link(slot).await;
        deleted.and(links::forget_address(SlotAddrs::for_slot(slot).sandbox).await)
    }

    /// Gives the host back its forwarding switch (a clean shutdown, with no sandbox left).
    pub fn restore_forwarding(&self) {
        forwarding::restore(&self.run_dir);
    }
}
