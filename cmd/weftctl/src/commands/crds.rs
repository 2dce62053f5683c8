//! `weftctl crds`: the CustomResourceDefinitions weft needs, as YAML for `kubectl apply`.

/// Prints the CRDs.
pub fn run() -> anyhow::Result<()> {
    print!("{}", weft_topology::crds_yaml());
    Ok(())
}
