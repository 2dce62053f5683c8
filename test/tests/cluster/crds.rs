//! `weftctl crds` and `manifests/crds/` say the same thing: the CRDs `kubectl apply -k
//! manifests/` installs are the ones the daemon's types describe.

use std::path::PathBuf;
use std::process::Command;

use weft_tests::bin;

#[test]
fn manifests_hold_exactly_what_weftctl_crds_prints() {
    let _area = weft_tests::area("cluster::crds");
    let out = Command::new(bin("weftctl")).arg("crds").output().unwrap();
    assert!(
        out.status.success(),
        "weftctl crds: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/crds/weft-crds.yaml");
    let held = std::fs::read_to_string(&file).unwrap();
    assert!(
        printed == held,
        "{} differs from `weftctl crds`: regenerate it with `weftctl crds > manifests/crds/weft-crds.yaml`",
        file.display()
    );
    // Both kinds, under the names meshnet/KNE and weft use.
    for name in ["name: topologies.networkop.co.uk", "name: wirestates.weft.dev"] {
        assert!(held.contains(name), "no {name} in {}", file.display());
    }
    let kustomization =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../manifests/kustomization.yaml"))
            .unwrap();
    assert!(
        kustomization.contains("crds/weft-crds.yaml"),
        "kubectl apply -k manifests/ does not install the CRDs"
    );
}
