//! The lab as the API server and kubelet of network policy: it writes the Namespace,
//! Pod and NetworkPolicy objects each node's weftd reads into the lab's topology
//! directory (one file per object, written through a rename, so a daemon never reads
//! half of one and a label change rewrites one small file), and changes them at run
//! time (`weftctl lab apply`, `delete`, `label`).
//!
//! What the lab file says is the start; run-time changes are kept in the lab's state
//! (`objects.json`, beside the topology directory) on top of it until `lab down`, so a
//! later `lab up` writes the file's objects with those changes still applied. Each
//! attached pod's addresses are kept beside it, one small file per pod (`pod-ips/`), so
//! reporting a pod's costs the same in a lab of thousands of pods as in one of three.
//! Each change holds `objects.lock` while it reads, changes and writes, so commands
//! running at once (and the parallel attaches of `up`) never lose one another's changes.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::LabError;
use crate::cluster::Lab;
use crate::spec::PodSpec;

use crate::kinds::{self, write_file};
use crate::spec::checks::shown;
pub use crate::spec::checks::{check_label_key, check_label_value, parse_label_change};
pub(crate) use crate::spec::checks::{check_policy, object_key, parse_policies};

use weft_topology::NAMESPACE_NAME_LABEL;

/// How long `up` lets running daemons notice new Pod objects before it attaches pods:
/// a daemon reloads the directory about 50 ms after inotify tells it of a change.
pub(crate) const SETTLE: Duration = Duration::from_millis(300);

const NAMESPACE_FILE: &str = "lab-namespace-";
const POLICY_FILE: &str = "lab-netpol-";
const POD_FILE: &str = "lab-pod-";
/// The directory of the lab's state where each attached pod's addresses are kept.
const POD_IPS_DIR: &str = "pod-ips";

/// What changed at run time, kept in the lab's state.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub(crate) struct Live {
    /// Label changes by object (`pod/<ns>/<name>`, `namespace/<name>`): a value sets
    /// the label, `null` removes it.
    labels: BTreeMap<String, BTreeMap<String, Option<String>>>,
    /// NetworkPolicies applied at run time by `<ns>/<name>` (they replace the lab
    /// file's of the same name).
    applied: BTreeMap<String, Value>,
    /// The lab file's NetworkPolicies deleted at run time.
    deleted: BTreeSet<String>,
    /// Pods' addresses by `<ns>/<name>` as a weftctl before `pod-ips/` kept them: read
    /// to move them there, never written.
    #[serde(skip_serializing)]
    pod_ips: BTreeMap<String, Vec<IpAddr>>,
    /// Where `lab matrix` takes its next block of UDP source ports (see `matrix`).
    pub(crate) probe_ports: u32,
}

/// The addresses of a CNI ADD result (`ips[].address`), IPv4 first.
pub(crate) fn result_ips(result: &[u8]) -> Vec<IpAddr> {
    let v: Value = serde_json::from_slice(result).unwrap_or_default();
    let mut ips: Vec<IpAddr> = v["ips"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i["address"].as_str()?.split('/').next()?.parse().ok())
        .collect();
    ips.sort_by_key(IpAddr::is_ipv6);
    ips
}

/// Labels with run-time changes applied.
fn with_changes(
    base: &BTreeMap<String, String>,
    changes: Option<&BTreeMap<String, Option<String>>>,
) -> BTreeMap<String, String> {
    let mut out = base.clone();
    for (k, v) in changes.into_iter().flatten() {
        match v {
            Some(v) => out.insert(k.clone(), v.clone()),
            None => out.remove(k),
        };
    }
    out
}

fn yaml(v: &Value) -> Result<String, LabError> {
    serde_yaml_ng::to_string(v).map_err(|e| LabError::Command {
        what: "writing the lab's objects".into(),
        detail: e.to_string(),
    })
}

/// What `lab label` labels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LabelTarget {
    /// A pod (`NS/NAME`, or a unique `NAME`).
    Pod,
    /// A namespace.
    Namespace,
}

/// What `lab apply` or `lab delete` did: one line per object, and the objects a delete
/// did not find.
#[derive(Debug, Clone, Default)]
pub struct ObjectChanges {
    /// `networkpolicy x/deny created` (`configured`, `unchanged`, `deleted`).
    pub lines: Vec<String>,
    /// `x/deny` for each object to delete that was not there.
    pub missing: Vec<String>,
}

impl Lab {
    fn objects_file(&self) -> PathBuf {
        self.state_dir().join("objects.json")
    }

    /// Runs `f` on the run-time changes under the lab's object lock, and keeps what it
    /// changed.
    pub(crate) fn with_live<R>(&self, f: impl FnOnce(&mut Live) -> Result<R, LabError>) -> Result<R, LabError> {
        let state = self.state_dir();
        fs::create_dir_all(state).map_err(|e| LabError::io("creating the lab directory", e))?;
        let lock = state.join("objects.lock");
        let file = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&lock)
            .map_err(|e| LabError::io(format!("opening {}", lock.display()), e))?;
        let _held = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
            .map_err(|(_, e)| LabError::io(format!("locking {}", lock.display()), e.into()))?;
        let path = self.objects_file();
        let before: Live = match fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| LabError::Command {
                what: format!("reading {}", path.display()),
                detail: e.to_string(),
            })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Live::default(),
            Err(e) => return Err(LabError::io(format!("reading {}", path.display()), e)),
        };
        let mut live = before.clone();
        for (key, ips) in std::mem::take(&mut live.pod_ips) {
            if let Some((ns, name)) = key.split_once('/') {
                self.keep_pod_ips(ns, name, &ips)?;
            }
        }
        let out = f(&mut live)?;
        if live != before {
            let text = serde_json::to_string_pretty(&live).unwrap_or_default();
            write_file(state, "objects.json", &text)?;
        }
        Ok(out)
    }

    /// Fails unless the lab has been brought up (its objects live in its state).
    fn ensure_up(&self) -> Result<(), LabError> {
        if self.topology_dir().is_dir() {
            Ok(())
        } else {
            Err(LabError::Command {
                what: format!("lab {}", self.spec.name),
                detail: format!(
                    "not up (no {}): run `weftctl lab up` first",
                    self.topology_dir().display()
                ),
            })
        }
    }

    /// Every namespace of the lab: those listed and those its pods are in.
    pub fn namespace_names(&self) -> BTreeSet<String> {
        let mut out: BTreeSet<String> = self.spec.namespaces.iter().map(|n| n.name.clone()).collect();
        out.extend(self.spec.pods.iter().map(|p| self.namespace_of(p)));
        out
    }

    fn namespace_object(&self, name: &str, live: &Live) -> Value {
        let spec = self.spec.namespaces.iter().find(|n| n.name == name);
        let labels = with_changes(
            &spec.map(|n| n.labels.clone()).unwrap_or_default(),
            live.labels.get(&format!("namespace/{name}")),
        );
        let mut v = kinds::namespace(name, labels);
        if let Some(a) = spec.map(|n| &n.annotations).filter(|a| !a.is_empty()) {
            v["metadata"]["annotations"] = json!(a);
        }
        v
    }

    /// Pod `p`'s labels now: the lab file's with `lab label`'s changes.
    fn labels_of(&self, p: &PodSpec, live: &Live) -> BTreeMap<String, String> {
        let key = format!("pod/{}/{}", self.namespace_of(p), p.name);
        with_changes(&p.labels, live.labels.get(&key))
    }

    fn pod_object(&self, p: &PodSpec, live: &Live) -> Value {
        let ns = self.namespace_of(p);
        let mut container = json!({"name": "main", "image": "weft-lab"});
        if !p.ports.is_empty() {
            let ports: Vec<Value> = p
                .ports
                .iter()
                .map(|port| {
                    let mut v = json!({"containerPort": port.container_port, "protocol": port.protocol});
                    if !port.name.is_empty() {
                        v["name"] = port.name.clone().into();
                    }
                    v
                })
                .collect();
            container["ports"] = ports.into();
        }
        let ips = self.kept_pod_ips(&ns, &p.name);
        kinds::pod(&ns, &p.name, &p.node, self.labels_of(p, live), container, &ips)
    }

    /// The file of the lab's state that keeps pod `ns/name`'s addresses (names of
    /// namespaces and pods hold no `_`).
    fn pod_ips_file(&self, ns: &str, name: &str) -> String {
        format!("{ns}_{name}.json")
    }

    /// Pod `ns/name`'s addresses as its ADD reported them (none before, or once it is
    /// detached; nor when the file cannot be read, as for a pod not reported yet).
    fn kept_pod_ips(&self, ns: &str, name: &str) -> Vec<IpAddr> {
        let path = self.state_dir().join(POD_IPS_DIR).join(self.pod_ips_file(ns, name));
        fs::read(path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default()
    }

    /// Keeps pod `ns/name`'s addresses (under the object lock).
    fn keep_pod_ips(&self, ns: &str, name: &str, ips: &[IpAddr]) -> Result<(), LabError> {
        let dir = self.state_dir().join(POD_IPS_DIR);
        fs::create_dir_all(&dir).map_err(|e| LabError::io(format!("creating {}", dir.display()), e))?;
        let text = serde_json::to_string(ips).unwrap_or_default();
        write_file(&dir, &self.pod_ips_file(ns, name), &text)?;
        Ok(())
    }

    /// Forgets pod `ns/name`'s addresses (under the object lock).
    fn forget_pod_ips(&self, ns: &str, name: &str) -> Result<(), LabError> {
        let file = self.state_dir().join(POD_IPS_DIR).join(self.pod_ips_file(ns, name));
        match fs::remove_file(&file) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                Err(LabError::io(format!("removing {}", file.display()), e))
            }
            _ => Ok(()),
        }
    }

    fn pod_file(&self, p: &PodSpec) -> String {
        format!("{POD_FILE}{}_{}.yaml", self.namespace_of(p), p.name)
    }

    /// The NetworkPolicies in force by `<ns>/<name>`: the lab file's, less those
    /// deleted, with those applied at run time over them.
    fn policies_of(&self, live: &Live) -> BTreeMap<String, Value> {
        let mut out: BTreeMap<String, Value> = self
            .policies
            .iter()
            .map(|v| (object_key(v), v.clone()))
            .filter(|(k, _)| !live.deleted.contains(k))
            .collect();
        out.extend(live.applied.clone());
        out
    }

    /// Writes every NetworkPolicy in force and removes the files of those that are not.
    fn write_policies(&self, live: &Live) -> Result<(), LabError> {
        let dir = self.topology_dir();
        let mut want = BTreeSet::new();
        for (key, v) in self.policies_of(live) {
            let name = format!("{POLICY_FILE}{}.yaml", key.replacen('/', "_", 1));
            write_file(&dir, &name, &yaml(&v)?)?;
            want.insert(name);
        }
        remove_others(&dir, POLICY_FILE, ".yaml", &want)?;
        Ok(())
    }

    /// Writes the lab's Namespace, NetworkPolicy and Pod objects (namespaces and
    /// policies first, so a pod never arrives before what it is policed by), removes
    /// those of objects no longer in the lab, and forgets the addresses of pods that
    /// are not attached. Returns whether a Pod object changed.
    pub fn publish_objects(&self) -> Result<bool, LabError> {
        let dir = self.topology_dir();
        fs::create_dir_all(&dir).map_err(|e| LabError::io("creating the lab directory", e))?;
        self.with_live(|live| {
            let attached: BTreeSet<String> = self
                .spec
                .pods
                .iter()
                .filter(|p| weft_harness::NamedNetns::exists(&self.netns_of(p)))
                .map(|p| self.pod_ips_file(&self.namespace_of(p), &p.name))
                .collect();
            let ips_dir = self.state_dir().join(POD_IPS_DIR);
            if ips_dir.is_dir() {
                remove_others(&ips_dir, "", ".json", &attached)?;
            }
            let mut want = BTreeSet::new();
            for ns in self.namespace_names() {
                let name = format!("{NAMESPACE_FILE}{ns}.yaml");
                write_file(&dir, &name, &yaml(&self.namespace_object(&ns, live))?)?;
                want.insert(name);
            }
            remove_others(&dir, NAMESPACE_FILE, ".yaml", &want)?;
            self.write_policies(live)?;
            let mut want = BTreeSet::new();
            let mut changed = false;
            for p in &self.spec.pods {
                let name = self.pod_file(p);
                changed |= write_file(&dir, &name, &yaml(&self.pod_object(p, live))?)?;
                want.insert(name);
            }
            changed |= remove_others(&dir, POD_FILE, ".yaml", &want)?;
            Ok(changed)
        })
    }

    /// Records pod `p`'s addresses (its `status.podIPs`) after its ADD and writes its
    /// Pod object with them, as kubelet reports them once the sandbox is up.
    pub fn report_pod_ips(&self, p: &PodSpec, ips: Vec<IpAddr>) -> Result<(), LabError> {
        self.report_pods_ips(vec![(p, ips)])
    }

    /// [`Lab::report_pod_ips`] for several pods at once: one update of the lab's state
    /// for all (which holds every pod's addresses, so a bring-up that reported pod by
    /// pod would rewrite it once per pod).
    pub(crate) fn report_pods_ips(&self, reports: Vec<(&PodSpec, Vec<IpAddr>)>) -> Result<(), LabError> {
        if reports.is_empty() {
            return Ok(());
        }
        self.with_live(|live| {
            for (p, ips) in reports {
                self.keep_pod_ips(&self.namespace_of(p), &p.name, &ips)?;
                write_file(
                    &self.topology_dir(),
                    &self.pod_file(p),
                    &yaml(&self.pod_object(p, live))?,
                )?;
            }
            Ok(())
        })
    }

    /// Removes pod `p`'s object, as the API server does once a pod is deleted.
    pub(crate) fn delete_pod_object(&self, p: &PodSpec) -> Result<(), LabError> {
        self.with_live(|_| {
            self.forget_pod_ips(&self.namespace_of(p), &p.name)?;
            let file = self.topology_dir().join(self.pod_file(p));
            match fs::remove_file(&file) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(LabError::io(format!("removing {}", file.display()), e))
                }
                _ => Ok(()),
            }
        })
    }

    /// Reads the NetworkPolicies of `files` (YAML or JSON, several documents each).
    fn read_policy_files(files: &[PathBuf]) -> Result<Vec<Value>, LabError> {
        let mut out = Vec::new();
        for f in files {
            let text = fs::read_to_string(f).map_err(|e| LabError::io(format!("reading {}", f.display()), e))?;
            out.extend(
                parse_policies(&text, &f.display().to_string()).map_err(|detail| LabError::Command {
                    what: format!("reading {}", f.display()),
                    detail,
                })?,
            );
        }
        Ok(out)
    }

    /// `kubectl apply` for the NetworkPolicies of `files`: each is checked first (none
    /// is applied if one is wrong), then created or replaced.
    pub fn apply_policies(&self, files: &[PathBuf]) -> Result<ObjectChanges, LabError> {
        self.ensure_up()?;
        let policies = Self::read_policy_files(files)?;
        let namespaces = self.namespace_names();
        let mut warnings = Vec::new();
        for p in &policies {
            warnings.extend(check_policy(p, &namespaces).map_err(|detail| LabError::Command {
                what: "lab apply".into(),
                detail,
            })?);
        }
        self.with_live(|live| {
            let mut out = ObjectChanges::default();
            out.lines.extend(warnings);
            for v in policies {
                let key = object_key(&v);
                let verb = match self.policies_of(live).get(&key) {
                    None => "created",
                    Some(old) if *old == v => "unchanged",
                    Some(_) => "configured",
                };
                live.deleted.remove(&key);
                live.applied.insert(key.clone(), v);
                out.lines.push(format!("{} {verb}", shown(&key)));
            }
            self.write_policies(live)?;
            Ok(out)
        })
    }

    /// `kubectl delete -f` for the NetworkPolicies of `files`, by namespace and name.
    pub fn delete_policies(&self, files: &[PathBuf]) -> Result<ObjectChanges, LabError> {
        self.ensure_up()?;
        let keys: Vec<String> = Self::read_policy_files(files)?.iter().map(object_key).collect();
        self.with_live(|live| {
            let mut out = ObjectChanges::default();
            for key in keys {
                if !self.policies_of(live).contains_key(&key) {
                    out.missing.push(key);
                    continue;
                }
                live.applied.remove(&key);
                if self.policies.iter().any(|v| object_key(v) == key) {
                    live.deleted.insert(key.clone());
                }
                out.lines.push(format!("{} deleted", shown(&key)));
            }
            self.write_policies(live)?;
            Ok(out)
        })
    }

    /// `kubectl label`: applies `changes` (`k=v` sets, `k-` removes) to a pod or a
    /// namespace and writes its object. Returns what it says now (`pod x/a labeled:
    /// app=a,role=client`).
    pub fn label(&self, target: LabelTarget, name: &str, changes: &[String]) -> Result<String, LabError> {
        self.ensure_up()?;
        let bad = |detail: String| LabError::Command {
            what: "lab label".into(),
            detail,
        };
        if changes.is_empty() {
            return Err(bad("no label changes given (KEY=VALUE or KEY-)".into()));
        }
        let parsed: Vec<(String, Option<String>)> = changes
            .iter()
            .map(|c| parse_label_change(c))
            .collect::<Result<_, _>>()
            .map_err(bad)?;
        let verb = if parsed.iter().all(|(_, v)| v.is_none()) {
            "unlabeled"
        } else {
            "labeled"
        };
        let show = |labels: &BTreeMap<String, String>| {
            labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        };
        match target {
            LabelTarget::Pod => {
                let p = self.find_pod(name)?;
                let key = format!("{}/{}", self.namespace_of(p), p.name);
                self.with_live(|live| {
                    live.labels
                        .entry(format!("pod/{key}"))
                        .or_default()
                        .extend(parsed.iter().cloned());
                    write_file(
                        &self.topology_dir(),
                        &self.pod_file(p),
                        &yaml(&self.pod_object(p, live))?,
                    )?;
                    Ok(format!("pod {key} {verb}: {}", show(&self.labels_of(p, live))))
                })
            }
            LabelTarget::Namespace => {
                if !self.namespace_names().contains(name) {
                    return Err(bad(format!(
                        "no namespace {name} in lab {} (it has {})",
                        self.spec.name,
                        self.namespace_names().into_iter().collect::<Vec<_>>().join(", ")
                    )));
                }
                if parsed.iter().any(|(k, _)| k == NAMESPACE_NAME_LABEL) {
                    return Err(bad(format!(
                        "{NAMESPACE_NAME_LABEL} is the namespace's name: it cannot change"
                    )));
                }
                self.with_live(|live| {
                    live.labels
                        .entry(format!("namespace/{name}"))
                        .or_default()
                        .extend(parsed.iter().cloned());
                    let v = self.namespace_object(name, live);
                    write_file(
                        &self.topology_dir(),
                        &format!("{NAMESPACE_FILE}{name}.yaml"),
                        &yaml(&v)?,
                    )?;
                    let labels: BTreeMap<String, String> =
                        serde_json::from_value(v["metadata"]["labels"].clone()).unwrap_or_default();
                    Ok(format!("namespace {name} {verb}: {}", show(&labels)))
                })
            }
        }
    }
}

/// Removes the files of `dir` named `<prefix>*.yaml` that are not in `keep`; returns
/// whether it removed one.
fn remove_others(dir: &Path, prefix: &str, suffix: &str, keep: &BTreeSet<String>) -> Result<bool, LabError> {
    let mut removed = false;
    let entries = fs::read_dir(dir).map_err(|e| LabError::io(format!("reading {}", dir.display()), e))?;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if name.starts_with(prefix) && name.ends_with(suffix) && !keep.contains(&name) {
            match fs::remove_file(e.path()) {
                Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                    return Err(LabError::io(format!("removing {}", e.path().display()), err));
                }
                _ => removed = true,
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests;
