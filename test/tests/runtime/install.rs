//! weft installed for real, the way `kubectl apply -k manifests/` installs it.
//!
//! - The manifests render (`kubectl kustomize manifests/`) and every object validates
//!   offline against the Kubernetes schemas (PyPI `kubernetes-validate`, pinned and put
//!   into `.venv` by `test/install-deps.sh`); the RBAC rules are exactly what weftd needs.
//! - The image is built from the `Containerfile` by `manifests/image/build.sh` (buildah,
//!   offline, storage driver vfs) out of debug builds of weftd and weftctl and a
//!   statically linked plugin this test builds itself (`cargo rustc --target <host>`, into
//!   `target/<host triple>/debug/weft`, so the workspace's `target/debug/weft` is never
//!   touched), and imported into a private containerd 1.6 running in a node network
//!   namespace. The DaemonSet's pod is then run through CRI as kubelet runs it: a host
//!   network, host PID, privileged sandbox; the `install-cni` init container to
//!   completion; then weftd, until its readiness probe answers. weftd reaches the
//!   Kubernetes API (an in-process fake, `weft_topology::testing`, serving a Node with
//!   `spec.podCIDRs` and an `InternalIP`) as a pod does: over HTTPS, found through
//!   `KUBERNETES_SERVICE_HOST`/`_PORT`, with the service-account token and CA mounted at
//!   `/var/run/secrets/kubernetes.io/serviceaccount`. A pod sandbox is created through
//!   CRI and must get an address from the node's podCIDRs; after weftd is stopped the
//!   conflist (and the plugin) are still there.
//! - The CRI configs are derived from the rendered DaemonSet, never written by hand
//!   ([`plan`]): image, command and args, environment, mounts (container paths,
//!   read-only, propagation), privileged, host network and PID. What stands in for
//!   kubelet is listed in [`Kubelet`] and nowhere else; a field of the DaemonSet the
//!   mapping does not know fails the test, so the test and the manifests cannot drift.
//!
//! The node: a network namespace (`eth0`, a veth to a second namespace that plays the
//! control plane and serves the API) and a mount namespace, which containerd and
//! everything it starts share. In it each `hostPath` of the DaemonSet is bind-mounted
//! from `<containerd dir>/node/<path>`, so the DaemonSet's paths are used unchanged while
//! the host's own directories stay untouched (a missing mount point, such as
//! /etc/cni/net.d, is created empty on the host and removed afterwards).
//!
//! Needs root, and beyond the containerd test's packages: `buildah`, `nftables`,
//! `conntrack`, kubectl (`/usr/bin/kubectl`) and `.venv` from `test/install-deps.sh`.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_cri::v1 as cri;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use weft_fakekube::FakeApiServer;
use weft_tests::cri::{
    Container, Containerd, Cri, NETWORK_READY, RUNTIME_READY, Sandbox, digest, elf_has_interpreter, pause_image,
    pod_sandbox_config, random_uid, sandbox_pid,
};
use weft_tests::{Netns, TempDir, bin, privileged, run, sh};

/// The Kubernetes versions whose schemas the rendered objects must satisfy: the API
/// weft is built against (k8s-openapi's `v1_33`) and the newest `kubernetes-validate`
/// 1.37.0 ships schemas for (it has 1.25 to 1.37).
const KUBERNETES_VERSIONS: [&str; 2] = ["1.33.0", "1.37.0"];
/// The node: its name, its underlay address (`InternalIP`, `status.hostIP`) and pod range.
const NODE_NAME: &str = "weft-install-node";
const NODE_ADDR: Ipv4Addr = Ipv4Addr::new(172, 31, 0, 2);
const POD_CIDR: &str = "10.244.91.0/24";
/// The control plane's address on the node's underlay, where the API server listens.
const API_ADDR: Ipv4Addr = Ipv4Addr::new(172, 31, 0, 1);
const API_PORT: u16 = 6443;
/// Where kubelet mounts a pod's service-account token, CA and namespace.
const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// The node's CNI directories, as containerd is configured on a kubeadm node.
const CNI_BIN_DIR: &str = "/opt/cni/bin";
const CNI_CONF_DIR: &str = "/etc/cni/net.d";
/// The sandbox image containerd is told to use; it exists only as imported here.
const PAUSE_IMAGE: &str = "localhost/weft/pause:install-test";

// ---------------------------------------------------------------------------------
// (a) The manifests render and validate offline.

#[test]
fn manifests_render_and_validate_offline_with_minimal_rbac() {
    let _area = weft_tests::area("runtime::install");
    let t0 = Instant::now();
    let text = kustomize();
    let objects = parse_documents(&text);
    let kinds: BTreeSet<String> = objects.iter().map(kind_name).collect();
    let want: BTreeSet<String> = [
        "CustomResourceDefinition/topologies.networkop.co.uk",
        "CustomResourceDefinition/wirestates.weft.dev",
        "ServiceAccount/weft",
        "ClusterRole/weft",
        "ClusterRoleBinding/weft",
        "ConfigMap/weft-cni-config",
        "DaemonSet/weftd",
    ]
    .map(String::from)
    .into();
    assert_eq!(kinds, want, "kubectl kustomize manifests/ rendered other objects");

    let dir = TempDir::new("kval");
    let file = dir.path().join("rendered.yaml");
    std::fs::write(&file, &text).unwrap();
    let validator = repo().join(".venv/bin/kubernetes-validate");
    assert!(
        validator.exists(),
        "{} is missing: run test/install-deps.sh",
        validator.display()
    );
    for version in KUBERNETES_VERSIONS {
        let out = run(Command::new(&validator).args(["--strict", "-k", version]).arg(&file));
        let report = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // Anything but a pass, a missing schema included, is a failure.
        let bad: Vec<&str> = report
            .lines()
            .filter(|l| !l.trim().is_empty() && !l.contains(" passed for resource "))
            .collect();
        let passed = report.lines().filter(|l| l.contains(" passed for resource ")).count();
        assert!(
            out.status.success() && bad.is_empty() && passed == objects.len(),
            "the rendered manifests do not validate against Kubernetes {version} \
             ({passed} of {} objects passed):\n{report}",
            objects.len()
        );
    }
    eprintln!(
        "{} objects valid for Kubernetes {KUBERNETES_VERSIONS:?} in {:.1?}",
        objects.len(),
        t0.elapsed()
    );

    // One conflist for every node: no per-node substitution, no ranges, no MTU.
    assert!(!text.contains("POD_CIDRS"), "a POD_CIDRS substitution is left:\n{text}");
    let conflist = conflist_of(&objects);
    let weft = conflist["plugins"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["type"] == "weft"))
        .unwrap_or_else(|| panic!("no weft plugin in the conflist: {conflist}"));
    assert!(weft.get("ranges").is_none(), "the conflist names ranges: {weft}");
    assert!(weft.get("mtu").is_none(), "the conflist sets an MTU: {weft}");
    assert_eq!(weft["capabilities"]["portMappings"], true, "{weft}");
    assert_eq!(weft["socket"], "/run/weft/weftd.sock", "{weft}");

    // The image is named once, in kustomization.yaml: every container of the rendered
    // DaemonSet carries the same, fully qualified reference.
    let ds = daemonset(&objects);
    let spec = &ds["spec"]["template"]["spec"];
    let images: BTreeSet<&str> = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| spec[k].as_array().unwrap())
        .map(|c| c["image"].as_str().unwrap())
        .collect();
    assert_eq!(
        images.len(),
        1,
        "the DaemonSet's containers use different images: {images:?}"
    );
    let image = images.into_iter().next().unwrap();
    assert!(
        image.contains('/') && image.contains(':') && !image.contains("ghcr.io/weft-cni"),
        "the rendered image {image:?} is not the one kustomization.yaml names"
    );

    // RBAC: what weftd does with the API, nothing more.
    let granted = granted(&objects);
    let want: BTreeSet<(String, String, String)> = [
        ("", "nodes", "list"),
        ("", "nodes", "watch"),
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "namespaces", "list"),
        ("", "namespaces", "watch"),
        ("networking.k8s.io", "networkpolicies", "list"),
        ("networking.k8s.io", "networkpolicies", "watch"),
        ("policy.networking.k8s.io", "clusternetworkpolicies", "list"),
        ("policy.networking.k8s.io", "clusternetworkpolicies", "watch"),
        ("networkop.co.uk", "topologies", "list"),
        ("networkop.co.uk", "topologies", "watch"),
        ("networkop.co.uk", "topologies/status", "patch"),
        ("weft.dev", "wirestates", "create"),
        ("weft.dev", "wirestates", "patch"),
        ("weft.dev", "wirestates/status", "patch"),
    ]
    .iter()
    .map(|(g, r, v)| (g.to_string(), r.to_string(), v.to_string()))
    .collect();
    assert_eq!(granted, want, "the ClusterRole grants other rights than weftd needs");
    let binding = objects.iter().find(|o| o["kind"] == "ClusterRoleBinding").unwrap();
    let sa = &binding["subjects"][0];
    assert_eq!(
        (sa["kind"].as_str(), sa["name"].as_str(), sa["namespace"].as_str()),
        (
            Some("ServiceAccount"),
            spec["serviceAccountName"].as_str(),
            ds["metadata"]["namespace"].as_str()
        ),
        "the ClusterRoleBinding does not bind the DaemonSet's service account"
    );
}

// ---------------------------------------------------------------------------------
// (c) The CRI configs follow the DaemonSet, with only the kubelet stand-ins added.

#[test]
fn cri_configs_follow_the_daemonset() {
    let _area = weft_tests::area("runtime::install");
    let objects = parse_documents(&kustomize());
    let ds = daemonset(&objects);
    let kubelet = Kubelet {
        node_name: NODE_NAME.to_string(),
        host_ip: NODE_ADDR.to_string(),
        service: SocketAddr::from((API_ADDR, API_PORT)),
        dir: PathBuf::from("/kubelet"),
        log_dir: PathBuf::from("/kubelet/logs"),
        cgroup_parent: "/test".to_string(),
    };
    let plan = plan(&ds, &objects, &kubelet);
    let spec = &ds["spec"]["template"]["spec"];
    let ns = plan.sandbox.linux.as_ref().unwrap().security_context.as_ref().unwrap();
    let opts = ns.namespace_options.as_ref().unwrap();
    assert_eq!(
        opts.network == cri::NamespaceMode::Node as i32,
        spec["hostNetwork"] == true,
        "host network"
    );
    assert_eq!(
        opts.pid == cri::NamespaceMode::Node as i32,
        spec["hostPID"] == true,
        "host PID"
    );

    let pairs = [
        (&spec["initContainers"], &plan.init),
        (&spec["containers"], &plan.containers),
    ];
    for (ds_containers, cri_containers) in pairs {
        let ds_containers = ds_containers.as_array().unwrap();
        assert_eq!(ds_containers.len(), cri_containers.len());
        for (c, cc) in ds_containers.iter().zip(cri_containers) {
            let name = c["name"].as_str().unwrap();
            assert_eq!(cc.metadata.as_ref().unwrap().name, name);
            assert_eq!(
                cc.image.as_ref().unwrap().image,
                c["image"].as_str().unwrap(),
                "{name}: image"
            );
            assert_eq!(cc.command, strings(&c["command"]), "{name}: command");
            assert_eq!(cc.args, strings(&c["args"]), "{name}: args");

            // Environment: the DaemonSet's, downward-API values resolved, plus the
            // API service kubelet injects.
            let mut want: Vec<(String, String)> = c["env"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|e| {
                    let n = e["name"].as_str().unwrap().to_string();
                    let v = match e["valueFrom"]["fieldRef"]["fieldPath"].as_str() {
                        Some("spec.nodeName") => NODE_NAME.to_string(),
                        Some("status.hostIP") => NODE_ADDR.to_string(),
                        Some(other) => panic!("{name}: unexpected fieldRef {other}"),
                        None => e["value"].as_str().unwrap().to_string(),
                    };
                    (n, v)
                })
                .collect();
            want.push(("KUBERNETES_SERVICE_HOST".into(), API_ADDR.to_string()));
            want.push(("KUBERNETES_SERVICE_PORT".into(), API_PORT.to_string()));
            let got: Vec<(String, String)> = cc.envs.iter().map(|kv| (kv.key.clone(), kv.value.clone())).collect();
            assert_eq!(got, want, "{name}: environment");

            // Mounts: the DaemonSet's container paths, options and sources, plus the
            // service account.
            let mut want: Vec<(String, String, bool, i32)> = c["volumeMounts"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|m| {
                    let vol = volume(spec, m["name"].as_str().unwrap());
                    let source = match (vol["hostPath"]["path"].as_str(), vol["configMap"]["name"].as_str()) {
                        (Some(p), _) => p.to_string(),
                        (None, Some(_)) => format!("/kubelet/configmaps/{}", vol["name"].as_str().unwrap()),
                        _ => panic!("unexpected volume {vol}"),
                    };
                    let propagation = match m["mountPropagation"].as_str() {
                        Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer as i32,
                        Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional as i32,
                        _ => cri::MountPropagation::PropagationPrivate as i32,
                    };
                    let ro = m["readOnly"] == true || vol.get("configMap").is_some();
                    (m["mountPath"].as_str().unwrap().to_string(), source, ro, propagation)
                })
                .collect();
            want.push((
                SERVICE_ACCOUNT_DIR.into(),
                "/kubelet/serviceaccount".into(),
                true,
                cri::MountPropagation::PropagationPrivate as i32,
            ));
            let got: Vec<(String, String, bool, i32)> = cc
                .mounts
                .iter()
                .map(|m| (m.container_path.clone(), m.host_path.clone(), m.readonly, m.propagation))
                .collect();
            assert_eq!(got, want, "{name}: mounts");

            let sc = cc.linux.as_ref().unwrap().security_context.as_ref().unwrap();
            assert_eq!(
                sc.privileged,
                c["securityContext"]["privileged"] == true,
                "{name}: privileged"
            );
            assert_eq!(sc.namespace_options.as_ref(), Some(opts), "{name}: namespaces");
        }
    }
    // The sandbox is privileged exactly when a container is (containerd refuses a
    // privileged container in an unprivileged sandbox).
    let any_privileged = plan
        .init
        .iter()
        .chain(&plan.containers)
        .any(|c| c.linux.as_ref().unwrap().security_context.as_ref().unwrap().privileged);
    assert_eq!(ns.privileged, any_privileged);
    // The node paths the DaemonSet uses are the node's CNI directories (where the
    // runtime looks) and weftd's own.
    for p in [CNI_BIN_DIR, CNI_CONF_DIR, "/run/weft", "/var/lib/weft", "/run/netns"] {
        assert!(
            plan.host_paths.iter().any(|h| h == p),
            "no hostPath {p}: {:?}",
            plan.host_paths
        );
    }
}

// ---------------------------------------------------------------------------------
// (b) + (d) The image, run as the DaemonSet runs it.

#[test]
fn the_image_runs_weftd_as_the_daemonset_does() {
    let _area = weft_tests::area("runtime::install");
    if !privileged() {
        return;
    }
    let t0 = Instant::now();
    let objects = parse_documents(&kustomize());
    let ds = daemonset(&objects);
    let spec = ds["spec"]["template"]["spec"].clone();
    let image = spec["containers"][0]["image"].as_str().unwrap().to_string();
    let work = TempDir::new("inst");

    // The image, from the Containerfile, out of debug weftd/weftctl and a static plugin.
    let plugin = static_plugin();
    let bins = work.path().join("bin");
    std::fs::create_dir_all(&bins).unwrap();
    for (name, src) in [
        ("weft", plugin.clone()),
        ("weftd", bin("weftd")),
        ("weftctl", bin("weftctl")),
    ] {
        std::fs::copy(&src, bins.join(name)).unwrap_or_else(|e| panic!("copying {}: {e}", src.display()));
    }
    let archive = work.path().join("weft-image.tar");
    let t_build = Instant::now();
    build_image(&bins, &image, &archive);
    eprintln!(
        "image {image} built in {:.1?} ({} MB)",
        t_build.elapsed(),
        std::fs::metadata(&archive).unwrap().len() >> 20
    );

    // The node's network: eth0 on an underlay shared with the control plane.
    let node = Netns::new("inst");
    let control = Netns::new("instapi");
    sh(Command::new("ip").args([
        "-n",
        node.name(),
        "link",
        "add",
        "eth0",
        "type",
        "veth",
        "peer",
        "name",
        "api0",
        "netns",
        control.name(),
    ]));
    for (ns, dev, addr) in [(&node, "eth0", NODE_ADDR), (&control, "api0", API_ADDR)] {
        sh(ns.cmd("ip").args(["addr", "add", &format!("{addr}/24"), "dev", dev]));
        sh(ns.cmd("ip").args(["link", "set", dev, "up"]));
    }
    sh(node
        .cmd("ip")
        .args(["route", "add", "default", "via", &API_ADDR.to_string()]));

    // The Kubernetes API: this node's Node object, served over HTTPS from the control
    // plane's namespace with a fresh CA and token.
    let api_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let api = FakeApiServer::new();
    api.put(&node_object());
    let token = format!("weft-test-{:032x}", rand::random::<u128>());
    let listener = control.bind_tcp(&format!("{API_ADDR}:{API_PORT}"));
    let endpoint = {
        let _guard = api_rt.enter();
        api.serve_https(listener, &token)
            .expect("serving the fake API over HTTPS")
    };

    // What kubelet materializes for the pod: its ConfigMap volumes and service account.
    let kubelet_dir = work.path().join("kubelet");
    let sa = kubelet_dir.join("serviceaccount");
    std::fs::create_dir_all(&sa).unwrap();
    std::fs::write(sa.join("token"), &endpoint.token).unwrap();
    std::fs::write(sa.join("ca.crt"), &endpoint.ca_pem).unwrap();
    std::fs::write(sa.join("namespace"), ds["metadata"]["namespace"].as_str().unwrap()).unwrap();

    // containerd on the node, the DaemonSet's hostPaths bound in its mount namespace.
    let host_paths = host_paths(&spec);
    let ctrd = Containerd::builder(&node, PAUSE_IMAGE)
        .tag("instctrd")
        .cni_dirs(CNI_BIN_DIR, CNI_CONF_DIR)
        .bind_host_paths(&host_paths)
        .start();
    let kubelet = Kubelet {
        node_name: NODE_NAME.to_string(),
        host_ip: NODE_ADDR.to_string(),
        service: endpoint.addr,
        dir: kubelet_dir.clone(),
        log_dir: ctrd.dir().join("pods/weftd"),
        cgroup_parent: ctrd.cgroup_parent(),
    };
    let plan = plan(&ds, &objects, &kubelet);
    for (dir, files) in &plan.config_maps {
        std::fs::create_dir_all(dir).unwrap();
        for (k, v) in files {
            std::fs::write(dir.join(k), v).unwrap();
        }
    }
    std::fs::create_dir_all(&kubelet.log_dir).unwrap();

    // What the node had before weft: the loopback plugin, and a file of someone else's
    // in each CNI directory. The install step must leave all of it alone.
    let bin_dir = ctrd.node_path(CNI_BIN_DIR);
    let conf_dir = ctrd.node_path(CNI_CONF_DIR);
    std::fs::copy("/usr/lib/cni/loopback", bin_dir.join("loopback"))
        .expect("/usr/lib/cni/loopback (install containernetworking-plugins)");
    std::fs::write(bin_dir.join("README"), "the node's own\n").unwrap();
    std::fs::write(conf_dir.join("README"), "the node's own\n").unwrap();
    let before = (listing(&bin_dir), listing(&conf_dir));

    ctrd.import(&pause_image(ctrd.dir(), PAUSE_IMAGE));
    ctrd.import(&archive);
    let cri = Cri::connect(&ctrd.socket());
    // The network is not ready before weft's config is installed, and need not be for a
    // host-network pod.
    cri.wait_ready(&[RUNTIME_READY], &[PAUSE_IMAGE, &image], Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("containerd's CRI did not become ready ({e})\n{}", ctrd.log_tail()));
    eprintln!("containerd ready, images imported after {:.1?}", t0.elapsed());

    // The DaemonSet's pod, as kubelet runs it: the sandbox, the init container to
    // completion, then weftd.
    let mut weftd_pod = Sandbox::run(&cri, plan.sandbox.clone())
        .unwrap_or_else(|e| panic!("RunPodSandbox (weftd) failed: {e}\n{}", ctrd.log_tail()));
    for config in &plan.init {
        let mut init = Container::create(&cri, &weftd_pod.id, &plan.sandbox, config.clone())
            .unwrap_or_else(|e| panic!("CreateContainer (init) failed: {e}\n{}", ctrd.log_tail()));
        // Kept, exited, until the pod goes, as kubelet keeps it.
        init.leave_to_sandbox();
        init.start()
            .unwrap_or_else(|e| panic!("StartContainer (init) failed: {e}\n{}", init.describe()));
        let st = init.wait_exited(Duration::from_secs(60));
        assert_eq!(st.exit_code, 0, "the init container failed:\n{}", init.describe());
        eprintln!(
            "init container {} done after {:.1?}",
            config.metadata.as_ref().unwrap().name,
            t0.elapsed()
        );
    }

    // The install step wrote exactly the plugin and the conflist, and nothing else.
    let conflist = conflist_of(&objects);
    let (bins_after, confs_after) = (listing(&bin_dir), listing(&conf_dir));
    assert_only_added(&before.0, &bins_after, "weft", CNI_BIN_DIR);
    assert_only_added(&before.1, &confs_after, "10-weft.conflist", CNI_CONF_DIR);
    let installed_plugin = std::fs::read(bin_dir.join("weft")).unwrap();
    assert!(
        installed_plugin == std::fs::read(&plugin).unwrap(),
        "the installed plugin is not the image's"
    );
    assert!(
        !elf_has_interpreter(&installed_plugin),
        "the installed plugin is not static"
    );
    assert_eq!(bins_after["weft"].1 & 0o777, 0o755, "plugin mode");
    let written: Value = serde_json::from_slice(&std::fs::read(conf_dir.join("10-weft.conflist")).unwrap()).unwrap();
    assert_eq!(written, conflist, "the installed conflist is not the ConfigMap's");

    // The node's wire certificate, where the DaemonSet's wire-tls hostPath is: issued
    // by a CA made here, naming the node and its address (manifests/wire-tls/README.md).
    let wire_tls = ctrd.node_path("/etc/weft/wire-tls");
    let ca_dir = work.path().join("wire-ca");
    sh(Command::new(bin("weftctl")).args(["certs", "ca", "--dir"]).arg(&ca_dir));
    sh(Command::new(bin("weftctl"))
        .args(["certs", "node", "--ca"])
        .arg(&ca_dir)
        .args(["--name", NODE_NAME, "--address", &NODE_ADDR.to_string(), "--out"])
        .arg(&wire_tls));
    let weftd_config = plan.containers[0].clone();
    let mut weftd = Container::create(&cri, &weftd_pod.id, &plan.sandbox, weftd_config)
        .unwrap_or_else(|e| panic!("CreateContainer (weftd) failed: {e}\n{}", ctrd.log_tail()));
    // Stopped below as kubelet stops it, and removed with its pod.
    weftd.leave_to_sandbox();
    weftd
        .start()
        .unwrap_or_else(|e| panic!("StartContainer (weftd) failed: {e}\n{}", weftd.describe()));
    let (probe_path, probe_port) = plan.readiness.clone().expect("weftd has a readiness probe");
    let ready_url = format!("http://{NODE_ADDR}:{probe_port}{probe_path}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if run(node.cmd("curl").args(["-sf", "--max-time", "2", &ready_url]))
            .status
            .success()
        {
            break;
        }
        let st = weftd.status();
        if st
            .as_ref()
            .is_ok_and(|s| s.state == cri::ContainerState::ContainerExited as i32)
            || Instant::now() > deadline
        {
            panic!(
                "weftd did not become ready at {ready_url} ({:?})\n{}\n--- API requests: {:?}",
                st.map(|s| s.state),
                weftd.describe(),
                api.log()
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("weftd ready after {:.1?}", t0.elapsed());
    // The wire port took the node's certificate from the hostPath: mTLS, no load error.
    let metrics = sh(node.cmd("curl").args([
        "-sf",
        "--max-time",
        "2",
        &format!("http://{NODE_ADDR}:{probe_port}/metrics"),
    ]));
    assert!(
        metrics.contains("\nweft_wire_insecure 0\n"),
        "the wire port is not on mTLS:\n{metrics}"
    );
    assert!(
        !metrics.contains("weft_wire_tls_reloads_total{result=\"error\"}"),
        "the wire TLS files did not load:\n{}",
        weftd.describe()
    );
    // It reached the API as a pod does: with the token, over TLS, and read the Nodes.
    assert_eq!(
        api.count("unauthorized"),
        0,
        "requests without the token: {:?}",
        api.log()
    );
    assert!(
        api.count("list nodes") + api.count("watch nodes") > 0,
        "weftd never asked for Nodes: {:?}",
        api.log()
    );
    let limit = Duration::from_secs(30);
    cri.wait_ready(&[NETWORK_READY], &[], limit).unwrap_or_else(|e| {
        panic!(
            "containerd did not load the installed CNI config within {limit:?} ({e})\n{}",
            ctrd.log_tail()
        )
    });

    // A pod on the node: its address comes from the Node's podCIDRs.
    let socket = ctrd.node_path("/run/weft").join("weftd.sock");
    let pod_outcome = run_a_pod(&cri, &ctrd, &socket);

    // weftd stops as kubelet stops it (SIGTERM, the grace period); the conflist and the
    // plugin stay, so pods keep being set up once it is back.
    weftd
        .stop(plan.grace)
        .unwrap_or_else(|e| panic!("StopContainer (weftd) failed: {e}\n{}", weftd.describe()));
    let st = weftd.wait_exited(Duration::from_secs(plan.grace as u64 + 10));
    assert_eq!(st.exit_code, 0, "weftd did not stop cleanly:\n{}", weftd.describe());
    assert!(!socket.exists(), "weftd left its socket behind after SIGTERM");
    let (bins_end, confs_end) = (listing(&bin_dir), listing(&conf_dir));
    assert_eq!(
        confs_end, confs_after,
        "the CNI config directory changed while weftd ran or stopped"
    );
    assert_eq!(
        bins_end, bins_after,
        "the CNI bin directory changed while weftd ran or stopped"
    );
    eprintln!("weftd stopped; conflist and plugin still in place");
    weftd_pod
        .stop()
        .unwrap_or_else(|e| panic!("StopPodSandbox (weftd) failed: {e}"));
    weftd_pod
        .remove()
        .unwrap_or_else(|e| panic!("RemovePodSandbox (weftd) failed: {e}"));

    // Every request weftd made is one its ClusterRole allows.
    let granted = granted(&objects);
    for request in api.log() {
        let Some((verb, resource)) = request.split_once(' ') else {
            continue;
        };
        if !["list", "watch", "get", "patch"].contains(&verb) {
            continue;
        }
        let group = match resource.split('/').next().unwrap() {
            "nodes" | "pods" | "namespaces" => "",
            "networkpolicies" => "networking.k8s.io",
            "clusternetworkpolicies" => "policy.networking.k8s.io",
            "topologies" => "networkop.co.uk",
            "wirestates" => "weft.dev",
            other => panic!("a request for {other}"),
        };
        assert!(
            granted.contains(&(group.to_string(), resource.to_string(), verb.to_string())),
            "weftd made a request its ClusterRole does not allow: {request}"
        );
    }
    drop(endpoint);

    if let Err(e) = pod_outcome {
        panic!("{e}");
    }
    eprintln!("the whole test took {:.1?}", t0.elapsed());
}

/// Runs a pod sandbox on the node through CRI, checks its address is from the Node's
/// podCIDRs, and removes it again. An error says what went wrong (the test goes on to
/// stop weftd, then fails with it).
fn run_a_pod(cri: &Cri, ctrd: &Containerd, socket: &Path) -> Result<(), String> {
    let config = pod_sandbox_config(ctrd, "weft-install-pod", &random_uid());
    let mut pod = Sandbox::run(cri, config).map_err(|e| {
        format!(
            "RunPodSandbox on the node failed (weft should allocate from the Node's podCIDRs {POD_CIDR}): {e}\n\
             --- weftctl calls:\n{}\n{}",
            weftctl(socket, &["calls"]),
            ctrd.log_tail()
        )
    })?;
    let status = pod.status()?;
    let ip_text = status
        .status
        .as_ref()
        .and_then(|s| s.network.as_ref())
        .map(|n| n.ip.clone())
        .unwrap_or_default();
    let ip: Ipv4Addr = ip_text
        .parse()
        .map_err(|_| format!("CRI reports no IPv4 address for the pod: {status:?}"))?;
    let (net, prefix) = POD_CIDR.split_once('/').unwrap();
    let (net, prefix): (Ipv4Addr, u32) = (net.parse().unwrap(), prefix.parse().unwrap());
    let mask = u32::MAX << (32 - prefix);
    if u32::from(ip) & mask != u32::from(net) {
        return Err(format!("the pod got {ip}, outside the Node's podCIDR {POD_CIDR}"));
    }
    // The kernel agrees: the pod's eth0 holds that address.
    let pid = sandbox_pid(&status.info)?;
    let out =
        run(Command::new("nsenter").args(["-t", &pid.to_string(), "-n", "ip", "-j", "-4", "addr", "show", "eth0"]));
    let addrs: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let local = addrs[0]["addr_info"][0]["local"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    if local != ip.to_string() {
        return Err(format!("the pod's eth0 holds {addrs}, CRI reports {ip}"));
    }
    let st = weftctl(socket, &["--json", "status"]);
    eprintln!("pod sandbox at {ip}; weftd: {st}");
    pod.stop()?;
    pod.remove()?;
    Ok(())
}

// ---------------------------------------------------------------------------------
// The mapping from the DaemonSet to CRI: what kubelet would do.

/// What stands in for kubelet, and the only values the test adds to the DaemonSet:
/// - the downward API: `spec.nodeName` is `node_name`, `status.hostIP` is `host_ip`;
/// - the API service environment kubelet gives every container:
///   `KUBERNETES_SERVICE_HOST`/`_PORT` from `service`;
/// - volumes: a `hostPath` is the same path on the node (the node's mount namespace
///   holds the test's directories there, see
///   [`weft_tests::cri::ContainerdBuilder::bind_host_paths`]); a `configMap` is
///   materialized under `dir/configmaps/<volume>` and mounted read-only; the service
///   account's token, CA and namespace (`dir/serviceaccount`) are mounted read-only at
///   [`SERVICE_ACCOUNT_DIR`], as automounting does;
/// - where logs go and the cgroup parent (the test's own, to clean up).
///
/// Probes are not CRI's: the test polls the readiness probe from the node as kubelet
/// does. Requests, ports (host network), tolerations and the priority class concern the
/// scheduler and kubelet's accounting and are not carried out.
struct Kubelet {
    node_name: String,
    host_ip: String,
    service: SocketAddr,
    dir: PathBuf,
    log_dir: PathBuf,
    cgroup_parent: String,
}

/// The DaemonSet's pod in CRI terms.
struct Plan {
    sandbox: cri::PodSandboxConfig,
    init: Vec<cri::ContainerConfig>,
    containers: Vec<cri::ContainerConfig>,
    /// Every hostPath volume's path.
    host_paths: Vec<String>,
    /// Directories to materialize ConfigMap volumes in, with their files.
    config_maps: Vec<(PathBuf, BTreeMap<String, String>)>,
    /// `terminationGracePeriodSeconds`.
    grace: i64,
    /// The first container's readiness probe: HTTP path and port.
    readiness: Option<(String, u16)>,
}

/// Fails on a key the mapping does not know, so a new field in the manifests cannot
/// silently go untested.
fn only_keys(what: &str, v: &Value, known: &[&str]) {
    for k in v.as_object().map(|o| o.keys()).into_iter().flatten() {
        assert!(
            known.contains(&k.as_str()),
            "{what} has `{k}`, which tests/install.rs does not map to CRI: teach `plan` what kubelet does with it"
        );
    }
}

fn plan(ds: &Value, objects: &[Value], kubelet: &Kubelet) -> Plan {
    let spec = &ds["spec"]["template"]["spec"];
    only_keys(
        "the DaemonSet's pod spec",
        spec,
        &[
            "serviceAccountName",
            "hostNetwork",
            "hostPID",
            "priorityClassName",
            "tolerations",
            "terminationGracePeriodSeconds",
            "initContainers",
            "containers",
            "volumes",
        ],
    );
    let mode = |on: bool| {
        if on {
            cri::NamespaceMode::Node as i32
        } else {
            cri::NamespaceMode::Pod as i32
        }
    };
    let namespaces = cri::NamespaceOption {
        network: mode(spec["hostNetwork"] == true),
        pid: mode(spec["hostPID"] == true),
        ipc: cri::NamespaceMode::Pod as i32,
        ..Default::default()
    };
    let mut config_maps = Vec::new();
    for v in spec["volumes"].as_array().into_iter().flatten() {
        only_keys("a volume", v, &["name", "hostPath", "configMap"]);
        if let Some(cm) = v.get("configMap") {
            only_keys("a configMap volume", cm, &["name"]);
            let name = cm["name"].as_str().unwrap();
            let object = objects
                .iter()
                .find(|o| o["kind"] == "ConfigMap" && o["metadata"]["name"] == name)
                .unwrap_or_else(|| panic!("no ConfigMap {name} in the manifests"));
            let files = object["data"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            config_maps.push((config_map_dir(kubelet, v), files));
        }
        if let Some(hp) = v.get("hostPath") {
            only_keys("a hostPath volume", hp, &["path", "type"]);
            assert!(
                matches!(hp["type"].as_str(), Some("DirectoryOrCreate" | "Directory")),
                "hostPath type {} is not mapped",
                hp["type"]
            );
        }
    }
    let container = |c: &Value| -> cri::ContainerConfig {
        let name = c["name"].as_str().unwrap();
        only_keys(
            &format!("container {name}"),
            c,
            &[
                "name",
                "image",
                "command",
                "args",
                "env",
                "securityContext",
                "ports",
                "livenessProbe",
                "readinessProbe",
                "resources",
                "volumeMounts",
            ],
        );
        only_keys(
            &format!("container {name}'s securityContext"),
            &c["securityContext"],
            &["privileged"],
        );
        let mut envs: Vec<cri::KeyValue> = c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|e| {
                only_keys(&format!("container {name}'s env"), e, &["name", "value", "valueFrom"]);
                let value = match (&e["value"], &e["valueFrom"]) {
                    (Value::String(v), Value::Null) => v.clone(),
                    (Value::Null, from) => {
                        only_keys("a valueFrom", from, &["fieldRef"]);
                        match from["fieldRef"]["fieldPath"].as_str() {
                            Some("spec.nodeName") => kubelet.node_name.clone(),
                            Some("status.hostIP") => kubelet.host_ip.clone(),
                            other => panic!("container {name}: the downward API field {other:?} is not mapped"),
                        }
                    }
                    other => panic!("container {name}: env entry {other:?} is not mapped"),
                };
                cri::KeyValue {
                    key: e["name"].as_str().unwrap().to_string(),
                    value,
                }
            })
            .collect();
        envs.push(cri::KeyValue {
            key: "KUBERNETES_SERVICE_HOST".into(),
            value: kubelet.service.ip().to_string(),
        });
        envs.push(cri::KeyValue {
            key: "KUBERNETES_SERVICE_PORT".into(),
            value: kubelet.service.port().to_string(),
        });
        let mut mounts: Vec<cri::Mount> = c["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                only_keys(
                    &format!("container {name}'s volumeMount"),
                    m,
                    &["name", "mountPath", "readOnly", "mountPropagation"],
                );
                let vol = volume(spec, m["name"].as_str().unwrap());
                let (host_path, always_ro) = if let Some(p) = vol["hostPath"]["path"].as_str() {
                    (p.to_string(), false)
                } else if vol.get("configMap").is_some() {
                    (config_map_dir(kubelet, vol).to_str().unwrap().to_string(), true)
                } else {
                    panic!("volume {vol} is not mapped")
                };
                let propagation = match m["mountPropagation"].as_str() {
                    None | Some("None") => cri::MountPropagation::PropagationPrivate,
                    Some("HostToContainer") => cri::MountPropagation::PropagationHostToContainer,
                    Some("Bidirectional") => cri::MountPropagation::PropagationBidirectional,
                    Some(other) => panic!("mountPropagation {other} is not mapped"),
                };
                cri::Mount {
                    container_path: m["mountPath"].as_str().unwrap().to_string(),
                    host_path,
                    readonly: always_ro || m["readOnly"] == true,
                    propagation: propagation as i32,
                    ..Default::default()
                }
            })
            .collect();
        if spec["serviceAccountName"].is_string() {
            mounts.push(cri::Mount {
                container_path: SERVICE_ACCOUNT_DIR.to_string(),
                host_path: kubelet.dir.join("serviceaccount").to_str().unwrap().to_string(),
                readonly: true,
                ..Default::default()
            });
        }
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.to_string(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: c["image"].as_str().unwrap().to_string(),
                ..Default::default()
            }),
            command: strings(&c["command"]),
            args: strings(&c["args"]),
            envs,
            mounts,
            log_path: format!("{name}/0.log"),
            linux: Some(cri::LinuxContainerConfig {
                security_context: Some(cri::LinuxContainerSecurityContext {
                    privileged: c["securityContext"]["privileged"] == true,
                    namespace_options: Some(namespaces.clone()),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    };
    let init: Vec<_> = spec["initContainers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(container)
        .collect();
    let containers: Vec<_> = spec["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .map(container)
        .collect();
    let privileged = init
        .iter()
        .chain(&containers)
        .any(|c| c.linux.as_ref().unwrap().security_context.as_ref().unwrap().privileged);
    let uid = random_uid();
    let sandbox = cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: format!("{}-{}", ds["metadata"]["name"].as_str().unwrap(), &uid[..5]),
            uid,
            namespace: ds["metadata"]["namespace"].as_str().unwrap_or("default").to_string(),
            attempt: 0,
        }),
        log_directory: kubelet.log_dir.to_str().unwrap().to_string(),
        labels: ds["spec"]["template"]["metadata"]["labels"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
            .collect(),
        linux: Some(cri::LinuxPodSandboxConfig {
            cgroup_parent: kubelet.cgroup_parent.clone(),
            security_context: Some(cri::LinuxSandboxSecurityContext {
                namespace_options: Some(namespaces.clone()),
                privileged,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let probe = &spec["containers"][0]["readinessProbe"]["httpGet"];
    let readiness = probe["path"].as_str().map(|p| {
        let port = match &probe["port"] {
            Value::Number(n) => n.as_u64().unwrap() as u16,
            Value::String(named) => spec["containers"][0]["ports"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| p["name"] == named.as_str())
                .and_then(|p| p["containerPort"].as_u64())
                .unwrap_or_else(|| panic!("no port named {named}")) as u16,
            other => panic!("readiness probe port {other}"),
        };
        (p.to_string(), port)
    });
    Plan {
        sandbox,
        init,
        containers,
        host_paths: host_paths(spec),
        config_maps,
        grace: spec["terminationGracePeriodSeconds"].as_i64().unwrap_or(30),
        readiness,
    }
}

fn config_map_dir(kubelet: &Kubelet, volume: &Value) -> PathBuf {
    kubelet.dir.join("configmaps").join(volume["name"].as_str().unwrap())
}

/// The paths of the pod spec's hostPath volumes.
fn host_paths(spec: &Value) -> Vec<String> {
    spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v["hostPath"]["path"].as_str().map(String::from))
        .collect()
}

fn volume<'a>(spec: &'a Value, name: &str) -> &'a Value {
    spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == name)
        .unwrap_or_else(|| panic!("no volume {name}"))
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

// ---------------------------------------------------------------------------------
// The manifests.

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

/// `kubectl kustomize manifests/`.
fn kustomize() -> String {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(repo().join("manifests"))
        .output()
        .unwrap_or_else(|e| panic!("running kubectl ({e}): it is needed to render the manifests"));
    assert!(
        out.status.success(),
        "kubectl kustomize manifests/ failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The documents of a multi-document YAML stream (as kubectl prints them), as JSON.
fn parse_documents(text: &str) -> Vec<Value> {
    let mut docs = vec![String::new()];
    for line in text.lines() {
        if line == "---" {
            docs.push(String::new());
        } else {
            let d = docs.last_mut().unwrap();
            d.push_str(line);
            d.push('\n');
        }
    }
    docs.iter()
        .filter(|d| !d.trim().is_empty())
        .map(|d| serde_yaml_ng::from_str::<Value>(d).unwrap_or_else(|e| panic!("rendered YAML ({e}):\n{d}")))
        .collect()
}

fn kind_name(o: &Value) -> String {
    format!(
        "{}/{}",
        o["kind"].as_str().unwrap_or_default(),
        o["metadata"]["name"].as_str().unwrap_or_default()
    )
}

fn daemonset(objects: &[Value]) -> Value {
    objects
        .iter()
        .find(|o| o["kind"] == "DaemonSet")
        .cloned()
        .expect("a DaemonSet in the manifests")
}

/// The network config the ConfigMap holds.
fn conflist_of(objects: &[Value]) -> Value {
    let cm = objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["data"].get("10-weft.conflist").is_some())
        .expect("a ConfigMap with 10-weft.conflist");
    let raw = cm["data"]["10-weft.conflist"].as_str().unwrap();
    serde_json::from_str(raw).unwrap_or_else(|e| panic!("the conflist is not JSON ({e}): {raw}"))
}

/// Every (API group, resource, verb) the ClusterRole grants.
fn granted(objects: &[Value]) -> BTreeSet<(String, String, String)> {
    let role = objects
        .iter()
        .find(|o| o["kind"] == "ClusterRole")
        .expect("a ClusterRole");
    let mut out = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for g in strings(&rule["apiGroups"]) {
            for r in strings(&rule["resources"]) {
                for v in strings(&rule["verbs"]) {
                    out.insert((g.clone(), r.clone(), v));
                }
            }
        }
    }
    out
}

/// The Node the fake API server serves for this node.
fn node_object() -> k8s_openapi::api::core::v1::Node {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": NODE_NAME},
        "spec": {"podCIDR": POD_CIDR, "podCIDRs": [POD_CIDR]},
        "status": {"addresses": [
            {"type": "InternalIP", "address": NODE_ADDR.to_string()},
            {"type": "Hostname", "address": NODE_NAME},
        ]},
    }))
    .unwrap()
}

// ---------------------------------------------------------------------------------
// The image.

/// The statically linked plugin, built for the host's target triple into
/// `target/<triple>/debug/weft` (cargo passes `+crt-static` to this crate alone, as
/// `cargo plugin-static` does where no musl target is installed: glibc is what every
/// machine that runs this suite has), so the workspace's `target/debug/weft` stays as
/// it is.
/// The first build compiles the plugin's dependencies for that directory once.
fn static_plugin() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    // target/debug/deps/<test> -> target
    let target = exe.ancestors().nth(3).unwrap().to_path_buf();
    let triple = format!("{}-unknown-linux-gnu", std::env::consts::ARCH);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    let t = Instant::now();
    let mut child = Command::new(cargo)
        .current_dir(repo())
        .args(["rustc", "--quiet", "-p", "weft", "--bin", "weft", "--target", &triple])
        .arg("--target-dir")
        .arg(&target)
        .args(["--", "-C", "target-feature=+crt-static", "-C", "strip=debuginfo"])
        .stdin(Stdio::null())
        .spawn()
        .expect("running cargo");
    let st = weft_tests::wait_exit(&mut child, Duration::from_secs(1200)).unwrap_or_else(|| {
        let _ = child.kill();
        let _ = child.wait();
        panic!("building the static plugin took over 20 minutes")
    });
    assert!(st.success(), "building the static plugin failed ({st})");
    let plugin = target.join(&triple).join("debug/weft");
    eprintln!("static plugin {} ready in {:.1?}", plugin.display(), t.elapsed());
    plugin
}

/// `manifests/image/build.sh -t image -o archive bins`, bounded.
fn build_image(bins: &Path, image: &str, archive: &Path) {
    let log = archive.with_extension("log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(repo().join("manifests/image/build.sh"))
        .args(["-t", image, "-o"])
        .arg(archive)
        .arg(bins)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("running manifests/image/build.sh");
    let st = weft_tests::wait_exit(&mut child, Duration::from_secs(600));
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    match st {
        Some(st) if st.success() => {}
        Some(st) => panic!("building the image failed ({st}):\n{text}"),
        None => {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            let _ = weft_tests::wait_exit(&mut child, Duration::from_secs(10)).or_else(|| {
                let _ = child.kill();
                child.wait().ok()
            });
            panic!("building the image took over 10 minutes:\n{text}")
        }
    }
}

/// Each file of a directory: (content hash, mode, size).
fn listing(dir: &Path) -> BTreeMap<String, (String, u32, u64)> {
    std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|e| {
            let e = e.unwrap();
            let m = std::fs::symlink_metadata(e.path()).unwrap();
            let data = if m.is_file() {
                std::fs::read(e.path()).unwrap()
            } else {
                vec![]
            };
            (
                e.file_name().to_string_lossy().into_owned(),
                (digest(&data), m.permissions().mode(), m.len()),
            )
        })
        .collect()
}

/// `after` is `before` plus `added`, every other entry unchanged.
fn assert_only_added(
    before: &BTreeMap<String, (String, u32, u64)>,
    after: &BTreeMap<String, (String, u32, u64)>,
    added: &str,
    what: &str,
) {
    let mut want = before.clone();
    want.remove(added);
    let mut got = after.clone();
    assert!(
        got.remove(added).is_some(),
        "the install step did not write {what}/{added}: {after:?}"
    );
    assert_eq!(got, want, "the install step touched other files in {what}");
}

fn weftctl(socket: &Path, args: &[&str]) -> String {
    let out = run(Command::new(bin("weftctl")).arg("--socket").arg(socket).args(args));
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}
