//! Which way traffic goes, as seen from the pod a policy selects: the one word the
//! model, its problems and the kernel's rules share.

use std::fmt;

/// Which way traffic goes, as seen from the pod a policy selects.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Direction {
    /// Traffic to the pod.
    Ingress,
    /// Traffic from the pod.
    Egress,
}

impl Direction {
    /// Both, ingress first.
    pub const BOTH: [Direction; 2] = [Direction::Ingress, Direction::Egress];

    /// The metric label and the spelling in logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Direction::Ingress => "ingress",
            Direction::Egress => "egress",
        }
    }

    /// One letter, for nftables object names.
    pub fn letter(self) -> char {
        match self {
            Direction::Ingress => 'i',
            Direction::Egress => 'e',
        }
    }
}

impl fmt::Display for Direction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
