//! A real headless browser for page tests: Debian's Chromium driven through
//! chromedriver's W3C WebDriver protocol (a few JSON calls over HTTP on loopback, so
//! a small client here rather than a WebDriver crate and its dependency tree).

use std::io::{Read as _, Write as _};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// A headless Chromium with one WebDriver session; both end when dropped.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
}

/// Whether `program` is installed (on `PATH`).
fn installed(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
}

impl Browser {
    /// Starts chromedriver on a free loopback port and a headless Chromium session,
    /// its profile under `profile`. Panics saying what to install when either is
    /// missing.
    pub fn start(profile: &Path) -> Browser {
        for (program, package) in [("chromedriver", "chromium-driver"), ("chromium", "chromium")] {
            assert!(
                installed(program),
                "{program} is not installed: apt-get install {package} (test/install-deps.sh does)"
            );
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting chromedriver");
        let mut b = Browser {
            driver,
            port,
            session: String::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(20);
        while b.call("GET", "/status", None).map(|v| v["ready"] == true) != Ok(true) {
            assert!(Instant::now() < deadline, "chromedriver did not become ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                // As root (CI) Chromium needs --no-sandbox; no GPU on a server.
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                         format!("--user-data-dir={}", profile.display()), "--window-size=1400,1000"],
            },
        }}});
        let v = b.call("POST", "/session", Some(&caps)).expect("a browser session");
        b.session = v["sessionId"].as_str().expect("a session id").to_string();
        b
    }

    /// Opens `url`.
    pub fn goto(&self, url: &str) {
        let path = format!("/session/{}/url", self.session);
        self.call("POST", &path, Some(&json!({"url": url})))
            .unwrap_or_else(|e| panic!("opening {url}: {e}"));
    }

    /// Runs `js` (a function body; `return` gives the value) in the page.
    pub fn script(&self, js: &str) -> Value {
        let path = format!("/session/{}/execute/sync", self.session);
        self.call("POST", &path, Some(&json!({"script": js, "args": []})))
            .unwrap_or_else(|e| panic!("running {js}: {e}"))
    }

    /// One WebDriver call: its `value`, or the driver's error.
    fn call(&self, method: &str, path: &str, body: Option<&Value>) -> Result<Value, String> {
        let body = body.map(Value::to_string).unwrap_or_default();
        let mut s = TcpStream::connect(("127.0.0.1", self.port)).map_err(|e| e.to_string())?;
        s.set_read_timeout(Some(Duration::from_secs(60)))
            .map_err(|e| e.to_string())?;
        write!(
            s,
            "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.port,
            body.len()
        )
        .map_err(|e| e.to_string())?;
        // chromedriver keeps the connection open whatever the request says: read the
        // head, then as much body as it announces.
        let mut raw = Vec::new();
        let mut buf = [0u8; 16 * 1024];
        let done = |raw: &[u8]| -> bool {
            let text = String::from_utf8_lossy(raw);
            let Some((head, rest)) = text.split_once("\r\n\r\n") else {
                return false;
            };
            let head = head.to_ascii_lowercase();
            match head.lines().find_map(|l| l.strip_prefix("content-length:")) {
                Some(n) => rest.len() >= n.trim().parse::<usize>().unwrap_or(0),
                None if head.contains("transfer-encoding: chunked") => rest.ends_with("0\r\n\r\n"),
                None => false,
            }
        };
        while !done(&raw) {
            let n = s.read(&mut buf).map_err(|e| e.to_string())?;
            if n == 0 {
                break;
            }
            raw.extend_from_slice(&buf[..n]);
        }
        let text = String::from_utf8_lossy(&raw);
        let (head, rest) = text.split_once("\r\n\r\n").ok_or("no HTTP answer")?;
        let content = if head.to_ascii_lowercase().contains("transfer-encoding: chunked") {
            dechunk(rest)
        } else {
            rest.to_string()
        };
        let v: Value = serde_json::from_str(&content).map_err(|e| format!("{e}: {content}"))?;
        if v["value"]["error"].is_string() {
            return Err(format!("{}: {}", v["value"]["error"], v["value"]["message"]));
        }
        Ok(v["value"].clone())
    }
}

/// The body of a chunked HTTP answer.
fn dechunk(mut rest: &str) -> String {
    let mut out = String::new();
    while let Some((size, after)) = rest.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = self.call("DELETE", &format!("/session/{}", self.session), None);
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn chunked_bodies_are_joined() {
        assert_eq!(super::dechunk("4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n"), "{\"a\":1}");
    }
}
