//! `weftctl crds`: the CustomResourceDefinitions weft needs, as YAML for `kubectl apply`.

/// Prints the CRDs.
pub fn run() -> anyhow::Result<()> {
    out!("{}", weft_topology::crds_yaml());
    Ok(())
}
