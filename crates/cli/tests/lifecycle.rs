//! Sessions ending, signals, embedded mode, and the `status` / `objects` commands.

mod common;

use std::collections::HashSet;
use std::net::TcpListener;
use std::process::Command;

use common::{eventually, field, kind, Server, Value};

#[test]
fn a_session_end_deletes_its_unnamed_objects_only() {
    let server = Server::start(&["--session-ttl", "1"]);
    let mut owner = server.session("short-lived");
    owner.create("Counter", "~short-lived.1", vec![7.into()], true).unwrap();
    owner.create("Counter", "~short-lived.2", vec![], true).unwrap();
    owner.create("Counter", "named", vec![3.into()], false).unwrap();
    let seq = owner.next_seq();
    let kept = owner.request(
        "keep",
        vec![seq.into(), "Counter".into(), "~short-lived.2".into(), Value::Nil],
    );
    assert_eq!(kept, Ok("~short-lived.2".into()));

    let mut observer = server.session("observer");
    assert_eq!(observer.call("Counter", "~short-lived.1", "get", vec![]), Ok(7.into()));
    drop(owner);

    eventually("the unnamed object is deleted", || {
        observer.call("Counter", "~short-lived.1", "get", vec![]).is_err()
    });
    assert_eq!(
        kind(observer.call("Counter", "~short-lived.1", "get", vec![])),
        "NotFound"
    );
    assert_eq!(observer.call("Counter", "named", "get", vec![]), Ok(3.into()));
    assert_eq!(observer.call("Counter", "~short-lived.2", "get", vec![]), Ok(0.into()));

    // The session is gone: the same client id starts afresh.
    let mut again = server.connect();
    assert_eq!(field(&again.hello("short-lived"), "resumed"), &Value::Boolean(false));
}

#[test]
fn a_reconnect_within_the_ttl_resumes_the_session() {
    let server = Server::start(&["--session-ttl", "60"]);
    let mut first = server.session("steady");
    first.create("Counter", "~steady.1", vec![], true).unwrap();
    drop(first);
    let mut second = server.connect();
    assert_eq!(field(&second.hello("steady"), "resumed"), &Value::Boolean(true));
    // Seqs continue across the session's connections (seq 1 was the create).
    assert_eq!(
        second.call_seq(2, "Counter", "~steady.1", "increment", vec![]),
        Ok(1.into())
    );
}

#[test]
fn a_second_connection_keeps_the_session_alive() {
    let server = Server::start(&["--session-ttl", "1"]);
    let mut first = server.session("two-lines");
    let mut second = server.session("two-lines");
    first.create("Counter", "~two-lines.1", vec![], true).unwrap();
    drop(first);

    // A session closed after `first` marks the passing of the TTL: once it has ended,
    // `first`'s TTL has run out too.
    let mut marker = server.session("marker");
    marker.create("Counter", "~marker.1", vec![], true).unwrap();
    drop(marker);
    let mut observer = server.session("observer");
    eventually("the marker session ends", || {
        observer.call("Counter", "~marker.1", "get", vec![]).is_err()
    });

    // Seqs are per session: seq 1 was the create on the first connection.
    assert_eq!(
        second.call_seq(2, "Counter", "~two-lines.1", "increment", vec![]),
        Ok(1.into())
    );
    let mut third = server.connect();
    assert_eq!(field(&third.hello("two-lines"), "resumed"), &Value::Boolean(true));
}

#[test]
fn sigterm_and_sigint_exit_cleanly() {
    for signal in ["TERM", "INT"] {
        let mut server = Server::start(&[]);
        let mut conn = server.session("bystander");
        assert_eq!(conn.request("ping", vec![]), Ok("pong".into()));
        server.signal(signal);
        let status = server.wait_exit();
        assert!(status.success(), "SIG{signal}: {status:?}");
    }
}

#[test]
fn an_embedded_server_exits_when_stdin_closes() {
    let mut server = Server::start(&["--embedded"]);
    assert_eq!(server.session("parent").request("ping", vec![]), Ok("pong".into()));
    server.close_stdin();
    assert!(server.wait_exit().success());
}

fn spindle(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(args)
        .env_remove("SPINDLE_ADDRESS")
        .output()
        .expect("run spindle")
}

#[test]
fn status_command_prints_an_aligned_summary() {
    let server = Server::start(&[]);
    let mut conn = server.session("for-status");
    conn.create("Counter", "one", vec![], false).unwrap();
    conn.create("Counter", "two", vec![], false).unwrap();

    let output = spindle(&["status", "--address", &server.address]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    let value_of = |label: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(label).filter(|rest| rest.starts_with(' ')))
            .unwrap_or_else(|| panic!("no {label} line in:\n{text}"))
            .trim()
            .to_string()
    };
    assert_eq!(value_of("address"), server.address);
    assert_eq!(value_of("objects"), "2");
    // Our connection and the command's own.
    assert_eq!(value_of("connections"), "2");
    assert!(value_of("calls/s").parse::<f64>().is_ok(), "{text}");
    assert!(value_of("uptime").ends_with('s'), "{text}");
    let columns: HashSet<usize> = text.lines().map(|l| l.len() - l[14..].trim_start().len()).collect();
    assert_eq!(columns, HashSet::from([15]), "values start in one column:\n{text}");

    // The address can come from the environment.
    let output = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .arg("status")
        .env("SPINDLE_ADDRESS", &server.address)
        .output()
        .unwrap();
    assert!(output.status.success());
}

#[test]
fn status_without_a_server_fails_clearly() {
    let free = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    // The listener is dropped: nothing listens on that port now.
    let output = spindle(&["status", "--address", &free]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains(&format!("no Spindle server at {free}")), "{stderr}");
    assert!(output.stdout.is_empty());
}

#[test]
fn objects_command_lists_named_objects() {
    let server = Server::start(&[]);
    let mut conn = server.session("for-objects");
    conn.create("Counter", "jobs/done", vec![], false).unwrap();
    conn.create("Counter", "jobs/all", vec![], false).unwrap();
    conn.create("Counter", "other", vec![], false).unwrap();
    conn.create("Counter", "~for-objects.1", vec![], true).unwrap();

    let output = spindle(&["objects", "jobs/", "--address", &server.address]);
    assert!(output.status.success());
    let text = String::from_utf8(output.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows, vec![vec!["jobs/all", "Counter"], vec!["jobs/done", "Counter"]]);

    let output = spindle(&["objects", "--address", &server.address]);
    let text = String::from_utf8(output.stdout).unwrap();
    assert_eq!(text.lines().count(), 3, "unnamed objects are not listed:\n{text}");
}

#[test]
fn objects_command_says_when_there_are_none() {
    let server = Server::start(&[]);
    let said = |args: &[&str]| {
        let output = spindle(args);
        assert!(output.status.success(), "{args:?}");
        assert!(output.stdout.is_empty(), "a listing piped elsewhere stays empty");
        String::from_utf8(output.stderr).unwrap()
    };
    let address = server.address.as_str();
    assert!(said(&["objects", "--address", address]).contains("no named objects on "));
    assert!(said(&["objects", "jobs/", "--address", address]).contains("no named objects starting with \"jobs/\""));
    assert!(said(&["objects", "--persistent", "--address", address]).contains("no persistent objects"));
}

#[test]
fn cluster_help_names_every_subcommand() {
    let top = String::from_utf8(spindle(&["--help"]).stdout).unwrap();
    let summary = top.lines().find(|l| l.trim_start().starts_with("cluster ")).unwrap();
    let cluster = String::from_utf8(spindle(&["cluster", "--help"]).stdout).unwrap();
    let first_line = cluster.lines().next().unwrap();
    for subcommand in ["local", "status", "add", "remove"] {
        assert!(summary.contains(&format!("`{subcommand}`")), "{summary}");
        assert!(first_line.contains(&format!("`{subcommand}`")), "{first_line}");
    }
}

#[test]
fn status_help_gives_each_default_once() {
    let help = String::from_utf8(spindle(&["status", "--help"]).stdout).unwrap();
    let address = help.lines().find(|l| l.contains("--address")).unwrap();
    assert_eq!(address.matches("default").count(), 1, "{address}");
    assert_eq!(address.matches("SPINDLE_ADDRESS").count(), 1, "{address}");
    for variable in ["SPINDLE_TLS_CA", "SPINDLE_TLS_CERT", "SPINDLE_TLS_KEY"] {
        assert_eq!(help.matches(variable).count(), 1, "{help}");
    }
}

#[test]
fn help_is_available_everywhere() {
    for args in [
        vec!["--help"],
        vec!["server", "--help"],
        vec!["status", "--help"],
        vec!["objects", "--help"],
    ] {
        let output = spindle(&args);
        assert!(output.status.success(), "{args:?}");
        assert!(String::from_utf8(output.stdout).unwrap().contains("Usage: spindle"));
    }
}
