//! A `domainNames` entry: an exact name or a `*.` wildcard, as the ClusterNetworkPolicy
//! API validates and documents them.

use std::fmt;

/// The longest name (RFC 1035, without its final dot).
const MAX_NAME: usize = 253;
/// The longest label.
const MAX_LABEL: usize = 63;

/// A name a rule allows: exact, or every name one or more whole labels below a suffix.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DomainPattern {
    /// `api.example.test`: that name only.
    Exact(String),
    /// `*.kubernetes.io`, kept as `kubernetes.io`: `www.kubernetes.io` and
    /// `latest.blog.kubernetes.io`, not `kubernetes.io` itself.
    Wildcard(String),
}

/// A name as compared: lower case, without a final dot.
pub fn normalize(name: &str) -> String {
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// Whether `l` is a label as the API's pattern writes it: letters, digits, `-` and `_`,
/// starting and ending with a letter or digit.
fn label(l: &str) -> bool {
    let b = l.as_bytes();
    !b.is_empty()
        && b.len() <= MAX_LABEL
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_')
}

impl DomainPattern {
    /// Reads an entry as the API's validation takes it (at least two labels, an
    /// optional final dot, `*.` only as a whole first label); the error says why not.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (wild, rest) = match s.strip_prefix("*.") {
            Some(r) => (true, r),
            None => (false, s),
        };
        let name = normalize(rest);
        if name.len() > MAX_NAME {
            return Err(format!("{s:?}: longer than {MAX_NAME} characters"));
        }
        let labels: Vec<&str> = name.split('.').collect();
        if labels.len() < 2 {
            return Err(format!("{s:?}: at least two labels (a name like example.com)"));
        }
        if let Some(bad) = labels.iter().find(|l| !label(l)) {
            return Err(format!(
                "{s:?}: label {bad:?} is not one (letters, digits, '-' and '_'; a wildcard is only a first label '*.')"
            ));
        }
        Ok(if wild {
            DomainPattern::Wildcard(name)
        } else {
            DomainPattern::Exact(name)
        })
    }

    /// Whether `name` (as a DNS answer writes it: any case, maybe a final dot) is one
    /// this entry allows.
    pub fn matches(&self, name: &str) -> bool {
        let name = normalize(name);
        match self {
            DomainPattern::Exact(n) => name == *n,
            DomainPattern::Wildcard(suffix) => name
                .strip_suffix(suffix.as_str())
                .and_then(|head| head.strip_suffix('.'))
                .is_some_and(|head| !head.is_empty()),
        }
    }
}

impl fmt::Display for DomainPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DomainPattern::Exact(n) => f.write_str(n),
            DomainPattern::Wildcard(n) => write!(f, "*.{n}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_match_one_or_more_whole_labels_as_the_api_documents() {
        let p = DomainPattern::parse("*.kubernetes.io").unwrap();
        assert!(p.matches("www.kubernetes.io"));
        assert!(p.matches("latest.blog.kubernetes.io"));
        assert!(p.matches("WWW.Kubernetes.IO."), "any case, a final dot");
        assert!(!p.matches("kubernetes.io"), "not the suffix itself");
        assert!(!p.matches("evilkubernetes.io"), "whole labels only");
        assert!(!p.matches("kubernetes.io.evil.test"));
        assert_eq!(p.to_string(), "*.kubernetes.io");
    }

    #[test]
    fn an_exact_name_matches_itself_only() {
        let p = DomainPattern::parse("API.example.test.").unwrap();
        assert_eq!(p, DomainPattern::Exact("api.example.test".into()));
        assert!(p.matches("api.example.test"));
        assert!(p.matches("api.example.test."));
        assert!(!p.matches("www.api.example.test"));
        assert!(!p.matches("example.test"));
    }

    #[test]
    fn what_the_api_refuses_is_refused() {
        for bad in [
            "localhost",
            "*.com.",
            "a..b",
            "*example.com",
            "www.*.example.com",
            "-a.example.com",
            "a-.example.com",
            "exa mple.com",
            "",
            "*.",
        ] {
            assert!(DomainPattern::parse(bad).is_err(), "{bad:?} is not a domain name");
        }
        assert!(DomainPattern::parse(&format!("{}.com", "a".repeat(64))).is_err());
        assert!(
            DomainPattern::parse("_srv.example.com").is_err(),
            "a label starts with a letter or digit"
        );
        assert!(DomainPattern::parse("a_b.example.com").is_ok());
        assert!(DomainPattern::parse("1.example.com").is_ok());
    }
}
