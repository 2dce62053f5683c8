//! `weftctl certs`: the certificates of the node-to-node wire port, for clusters that do
//! not use cert-manager: a CA, and per node a certificate naming the node's name and
//! addresses, written as the three files weftd's `--wire-tls-dir` reads or printed as
//! a `kubernetes.io/tls` Secret.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use weft_wiretls::issue::{Authority, CA_KEY_FILE, secret_yaml, write_tls_dir};

/// What to make.
#[derive(Subcommand, Debug)]
pub enum CertsAction {
    /// Makes a CA in DIR (ca.crt, and ca.key, which never leaves this machine).
    Ca {
        /// Where to keep the CA.
        #[arg(long)]
        dir: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "weft wire CA")]
        name: String,
    },
    /// Issues a node's certificate from the CA in --ca.
    Node(NodeArgs),
}

/// `weftctl certs node`.
#[derive(Args, Debug)]
pub struct NodeArgs {
    /// The CA's directory (from `weftctl certs ca`).
    #[arg(long)]
    ca: PathBuf,
    /// The node's name, as its Node object has it.
    #[arg(long)]
    name: String,
    /// The node's underlay address (the one peers reach its wire port on); repeat for
    /// several.
    #[arg(long = "address", required = true)]
    addresses: Vec<IpAddr>,
    /// Write ca.crt, tls.crt and tls.key here (the node's /etc/weft/wire-tls).
    #[arg(long, conflicts_with = "secret")]
    out: Option<PathBuf>,
    /// Print a kubernetes.io/tls Secret of this name instead.
    #[arg(long)]
    secret: Option<String>,
    /// The Secret's namespace.
    #[arg(long, default_value = "kube-system")]
    namespace: String,
}

/// Runs a `certs` action.
pub fn run(action: CertsAction) -> anyhow::Result<()> {
    match action {
        CertsAction::Ca { dir, name } => {
            if dir.join(CA_KEY_FILE).exists() {
                bail!("{} already holds a CA; not replacing it", dir.display());
            }
            let ca = Authority::generate(&name)?;
            ca.save(&dir)?;
            eprintln!("CA written to {}", dir.display());
            Ok(())
        }
        CertsAction::Node(a) => {
            let ca = Authority::load(&a.ca).with_context(|| format!("reading the CA in {}", a.ca.display()))?;
            let cert = ca.issue(&a.name, &a.addresses)?;
            match (a.out, a.secret) {
                (Some(out), _) => {
                    write_tls_dir(&out, ca.cert_pem(), &cert)?;
                    eprintln!("{}: ca.crt, tls.crt, tls.key for node {}", out.display(), a.name);
                }
                (None, Some(secret)) => out!("{}", secret_yaml(&secret, &a.namespace, ca.cert_pem(), &cert)),
                (None, None) => bail!("say where the certificate goes: --out DIR or --secret NAME"),
            }
            Ok(())
        }
    }
}
