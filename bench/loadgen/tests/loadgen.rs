//! The load generator against a real `spindle server` (the release binary next to this test's
//! binary, or `$SPINDLE_BIN`), so that it cannot rot. No timing thresholds: only that calls
//! complete without errors, and that failures exit non-zero.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

const LOADGEN: &str = env!("CARGO_BIN_EXE_spindle-loadgen");

fn spindle_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SPINDLE_BIN") {
        return PathBuf::from(path);
    }
    let here = PathBuf::from(LOADGEN);
    let dir = here.parent().expect("the loadgen's directory");
    let candidates = [dir.join("spindle"), dir.join("../release/spindle")];
    candidates.iter().find(|p| p.exists()).cloned().unwrap_or_else(|| {
        panic!(
            "no spindle binary beside {LOADGEN}: run `cargo build --release -p spindle-cli` first \
             (or set SPINDLE_BIN)"
        )
    })
}

struct Server {
    child: Child,
    address: String,
}

impl Server {
    fn start() -> Server {
        Server::start_with(&[])
    }

    fn start_with(args: &[&str]) -> Server {
        let mut child = Command::new(spindle_binary())
            .args(["server", "--port", "0"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn spindle server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the listening line");
        let address = line
            .trim_end()
            .strip_prefix("spindle listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        Server { child, address }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The integer after `"name": ` in the loadgen's one-line JSON.
fn field(json: &str, name: &str) -> u64 {
    let key = format!("\"{name}\": ");
    let at = json.find(&key).unwrap_or_else(|| panic!("no {name} in {json}")) + key.len();
    json[at..]
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|d| d.parse().ok())
        .unwrap_or_else(|| panic!("{name} is not an integer in {json}"))
}

#[test]
fn persistent_objects_are_made_persistent() {
    let dir = std::env::temp_dir().join(format!("spindle-loadgen-test-{}", std::process::id()));
    let server = Server::start_with(&["--data-dir", dir.to_str().expect("a UTF-8 path")]);
    let out = Command::new(LOADGEN)
        .args([
            "--target",
            "spindle",
            "--address",
            &server.address,
            "--op",
            "incr",
            "--persistent",
        ])
        .args(["--connections", "2", "--keys", "3", "--seconds", "0.3", "--warmup", "0"])
        .output()
        .expect("run spindle-loadgen");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(field(&stdout, "errors"), 0, "{stdout}");
    let listed = Command::new(spindle_binary())
        .args(["objects", "--persistent", "--address", &server.address])
        .output()
        .expect("run spindle objects");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert_eq!(listed.lines().filter(|l| l.contains("Counter")).count(), 3, "{listed}");
    drop(server);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn drives_a_real_server_without_errors() {
    let server = Server::start();
    for op in ["incr", "multiply", "put", "get"] {
        let out = Command::new(LOADGEN)
            .args(["--target", "spindle", "--address", &server.address, "--op", op])
            .args(["--connections", "4", "--pipeline", "2", "--keys", "8"])
            .args(["--seconds", "0.5", "--warmup", "0.1"])
            .output()
            .expect("run spindle-loadgen");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{op}: {}\n{stdout}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(field(&stdout, "ops") > 0, "{op}: {stdout}");
        assert_eq!(field(&stdout, "errors"), 0, "{op}: {stdout}");
    }
    // `put` wrote 1 KB values (the default --value-size) into Blobs that every program sees.
    let got = Command::new(spindle_binary())
        .args(["blob", "-n", "blob-0", "get"])
        .env("SPINDLE_ADDRESS", &server.address)
        .output()
        .expect("run spindle blob");
    assert!(got.status.success(), "{}", String::from_utf8_lossy(&got.stderr));
    let want: Vec<u8> = (0..1024).map(|i| b'a' + (i % 26) as u8).collect();
    assert_eq!(got.stdout, want);
}

#[test]
fn fails_clearly_without_a_server_or_with_error_replies() {
    // Nothing listens on a port just released.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let out = Command::new(LOADGEN)
        .args([
            "--target",
            "spindle",
            "--address",
            &format!("127.0.0.1:{port}"),
            "--op",
            "incr",
        ])
        .args(["--seconds", "0.2", "--warmup", "0"])
        .output()
        .expect("run spindle-loadgen");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot connect"));

    // A user-defined type nobody created: every call is an error reply.
    let server = Server::start();
    let out = Command::new(LOADGEN)
        .args(["--target", "spindle", "--address", &server.address, "--op", "complex"])
        .args(["--connections", "2", "--keys", "4", "--seconds", "0.2", "--warmup", "0"])
        .output()
        .expect("run spindle-loadgen");
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("NotFound"));
}
