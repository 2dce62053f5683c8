//! CHECK, STATUS, GC and the reconcile pass: comparing the kernel with the store and repairing it.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;

use tracing::{Instrument, info, warn};
use weft_cni::{Cmd, CniError, Code, NetworkConfig};
use weft_kernel::KernelError;
use weft_portmap::Entries;
use weft_store::State;

use crate::call::CniCall;
use crate::seams::{Ipam, PodNetworking, TableSync};

use super::Handler;
use super::convert::{decode, pod_routes};
use super::convert::{host_port_entries, pod_network};
use super::errors::{kernel_err, store_err};

impl<I: Ipam, K: PodNetworking> Handler<I, K> {
    /// Compares every attachment with the kernel and repairs what drifted (a deleted
    /// route, address or veth pair comes back), collects attachments whose network
    /// namespace is gone (their addresses are released and their wires removed), and
    /// rewrites the host port table if it differs from the store. Returns how many items
    /// of each kind it repaired (`veth`, `link_up`, `address`, `route`, `neighbour`, `collected`,
    /// `hostports`). Runs at start, before serving, and every reconcile interval; each
    /// attachment is handled under its container's lock, so it never races a call.
    pub async fn reconcile(&self) -> Result<BTreeMap<&'static str, u64>, CniError> {
        Ok(self.reconcile_known(None).await?.0)
    }

    /// The ids of the attachments ready now: what a later [`Handler::reconcile_known`]
    /// is to check.
    pub async fn ready_ids(&self) -> Result<HashSet<i64>, CniError> {
        let ready = self.ipam.list(None, Some(State::Ready)).await.map_err(store_err)?;
        Ok(ready.iter().map(|a| a.id).collect())
    }

    /// [`Handler::reconcile`] for the periodic pass: with `known` (the ids ready at the
    /// last pass), only those attachments are checked. One made since was set up by its
    /// ADD moments ago and is checked by the next pass, so a pass does not go through
    /// every pod a bring-up is making (work that would grow with the pods times the
    /// bring-up's length); drift is still repaired within two intervals of an ADD and
    /// within one after. Returns what it repaired and the ids ready now.
    pub async fn reconcile_known(
        &self,
        known: Option<&HashSet<i64>>,
    ) -> Result<(BTreeMap<&'static str, u64>, HashSet<i64>), CniError> {
        let mut repaired: BTreeMap<&'static str, u64> = BTreeMap::new();
        let ready = self.ipam.list(None, Some(State::Ready)).await.map_err(store_err)?;
        let now: HashSet<i64> = ready.iter().map(|a| a.id).collect();
        for att in ready.into_iter().filter(|a| known.is_none_or(|k| k.contains(&a.id))) {
            let _guard = self.locks.lock(&att.key.container_id).await;
            // A DEL waiting in the spool has cut the pod off already: nothing to repair.
            if self.teardowns.pending(&att.key) || self.del_waits_in_spool(&att.key) {
                continue;
            }
            // Re-read under the lock: a DEL or an ADD may have come first.
            let current = self.ipam.get(att.key.clone()).await.map_err(store_err)?;
            let Some(att) = current.filter(|c| c.id == att.id && c.state == State::Ready) else {
                continue;
            };
            match self.net.validate_netns(PathBuf::from(&att.netns)).await {
                Ok(()) => {}
                Err(KernelError::InvalidNetns { reason, .. }) => {
                    warn!(attachment = %att.key, netns = %att.netns, reason = %reason, "the pod's network namespace is gone: collecting the attachment");
                    let Some(gone) = self.ipam.begin_del(att.key.clone()).await.map_err(store_err)? else {
                        continue;
                    };
                    if let (Some(w), Some(pod)) = (&self.wiring, Self::wired_pod(&gone)) {
                        w.pod_removed(pod).await;
                    }
                    if let Some(task) = self.start_teardown(gone).await {
                        let _ = task.await;
                    }
                    *repaired.entry("collected").or_default() += 1;
                    continue;
                }
                Err(e) => {
                    warn!(attachment = %att.key, error = %e, "cannot check the pod's network namespace");
                    continue;
                }
            }
            let repaired_now = {
                let _gateways = self.gateways.read().await;
                self.net.repair(pod_network(&att), pod_routes(&att)).await
            };
            match repaired_now {
                Ok(kinds) => {
                    for kind in kinds {
                        warn!(attachment = %att.key, kind, "kernel state had drifted from the store: repaired");
                        *repaired.entry(kind).or_default() += 1;
                    }
                }
                Err(e) => warn!(attachment = %att.key, error = %e, "could not repair the pod's networking"),
            }
        }
        // What a DEL could not let go of (a store that did not answer, a crash between
        // the release of a pod's addresses and of its gateway).
        crate::gateways::release_unused(self.ipam.as_ref(), self.net.as_ref(), &self.gateways).await;
        match self.sync_host_ports().await? {
            TableSync::InSync => {}
            TableSync::Created => info!("host port table created"),
            TableSync::Reshaped => info!("host port table rewritten for the current options"),
            TableSync::Drifted => {
                warn!("the host port table had drifted from the store and was rewritten");
                *repaired.entry("hostports").or_default() += 1;
            }
        }
        Ok((repaired, now))
    }

    /// Makes the kernel's host port table match the store; says what it found.
    pub async fn sync_host_ports(&self) -> Result<TableSync, CniError> {
        let held = self.ipam.held_ports().await.map_err(store_err)?;
        let mut all = Entries::default();
        // The host ports of a pod whose DEL waits in the spool went with that DEL.
        for h in held.into_iter().filter(|h| !self.del_waits_in_spool(&h.key)) {
            let e = host_port_entries(&h.host_ifname, std::slice::from_ref(&h.mapping));
            all.ports.extend(e.ports);
            for hp in e.hairpins {
                if !all.hairpins.contains(&hp) {
                    all.hairpins.push(hp);
                }
            }
        }
        self.net.sync_host_ports(all).await.map_err(kernel_err)
    }

    /// CHECK: compare the pod's networking with what weft set up.
    pub async fn check(&self, args: &CniCall) -> Result<(), CniError> {
        let (conf, key) = decode(args, Cmd::Check)?;
        self.check_netns(&args.netns).await?;
        let _guard = self
            .locks
            .lock(&args.container_id)
            .instrument(phase!("lock_wait"))
            .await;
        let found = self.ipam.get(key.clone()).instrument(phase!("ipam")).await;
        let att = match found.map_err(store_err)? {
            Some(a) if a.state == State::Ready && !self.teardowns.pending(&key) => a,
            _ => {
                return Err(CniError::new(
                    Code::UnknownContainer,
                    format!("weft has no attachment {key}"),
                ));
            }
        };
        if att.netns != args.netns {
            return Err(CniError::new(
                Code::CheckFailed,
                format!("attachment {key} was made in {}, CHECK names {}", att.netns, args.netns),
            ));
        }
        if let Some(prev) = &conf.prev_result {
            for a in &att.addresses {
                if !prev.ips.iter().any(|ip| ip.address.addr() == a.address) {
                    return Err(CniError::new(
                        Code::CheckFailed,
                        format!("prevResult does not list the pod's address {}", a.address),
                    ));
                }
            }
        }
        self.net
            .check(pod_network(&att), pod_routes(&att))
            .instrument(phase!("check"))
            .await
            .map_err(kernel_err)
    }

    /// STATUS: can ADD be served for this config? Code 50 when every range of one of
    /// its address families is full, or when it leaves the ranges to a node that has
    /// none yet.
    pub async fn status(&self, args: &CniCall) -> Result<(), CniError> {
        let conf = NetworkConfig::parse(&args.config, Cmd::Status)?;
        let eff = self.effective(&conf, Cmd::Status)?;
        let usage = self.ipam.usage_of(eff.ranges).await.map_err(store_err)?;
        for v6 in [false, true] {
            let fam: Vec<_> = usage.iter().filter(|u| u.range.addr().is_ipv6() == v6).collect();
            if !fam.is_empty() && fam.iter().all(|u| u.is_full()) {
                return Err(CniError::new(
                    Code::NotAvailable,
                    format!(
                        "every {} range is full: {}",
                        if v6 { "IPv6" } else { "IPv4" },
                        fam.iter().map(|u| u.range.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// GC: remove every attachment of the network the runtime no longer lists, and
    /// finish any teardown a crash interrupted. Returns how many were removed.
    pub async fn gc(&self, args: &CniCall) -> Result<u32, CniError> {
        let conf = NetworkConfig::parse(&args.config, Cmd::Gc)?;
        let Some(valid) = conf.valid_attachments.as_ref() else {
            return Err(CniError::new(
                Code::InvalidConfig,
                "GC needs `cni.dev/valid-attachments` in the config",
            ));
        };
        let valid: HashSet<(&str, &str)> = valid
            .iter()
            .map(|a| (a.container_id.as_str(), a.ifname.as_str()))
            .collect();
        let all = self.ipam.list(Some(conf.name.clone()), None).await.map_err(store_err)?;
        let mut removed = 0;
        for att in all {
            if valid.contains(&(att.key.container_id.as_str(), att.key.ifname.as_str())) {
                continue;
            }
            let _guard = self.locks.lock(&att.key.container_id).await;
            if self.teardowns.pending(&att.key) {
                continue;
            }
            // Re-read under the lock: a DEL may have raced us.
            let Some(current) = self.ipam.begin_del(att.key.clone()).await.map_err(store_err)? else {
                continue;
            };
            info!(attachment = %current.key, "GC removes an attachment the runtime no longer lists");
            if let Some(task) = self.start_teardown(current).await {
                let _ = task.await;
            }
            removed += 1;
        }
        Ok(removed)
    }
}
