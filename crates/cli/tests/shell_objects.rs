//! Shared objects as shell commands (`counter -n c increment`, docs/shell.md): the real
//! binary, run through links named after the types (multi-call) and as `spindle TYPE`,
//! against a real server. What a command printed is checked, and what it left in the server
//! through this harness's own protocol client.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{eventually, ParkedProbe, Server, Value};

const BIN: &str = env!("CARGO_BIN_EXE_spindle");
const TYPES: [&str; 11] = spindle_proto::SHELL_OBJECT_COMMANDS;

/// A directory of links named after the types, and the server they talk to.
struct Shell {
    dir: PathBuf,
    address: String,
}

impl Shell {
    fn new(server: &Server) -> Shell {
        Shell::at(&server.address)
    }

    fn at(address: &str) -> Shell {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "shell-objects-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("temp dir");
        for t in TYPES {
            std::os::unix::fs::symlink(BIN, dir.join(t)).expect("link");
        }
        Shell {
            dir,
            address: address.to_string(),
        }
    }

    /// `TYPE ARGS...` through the link named TYPE.
    fn command(&self, type_name: &str, args: &[&str]) -> Command {
        let mut command = Command::new(self.dir.join(type_name));
        command.args(args);
        self.environment(&mut command);
        command
    }

    fn environment(&self, command: &mut Command) {
        command
            .env("SPINDLE_ADDRESS", &self.address)
            .env_remove("SPINDLE_TOKEN");
    }

    fn run(&self, type_name: &str, args: &[&str]) -> Output {
        self.command(type_name, args).output().expect("run the command")
    }

    fn run_with_input(&self, type_name: &str, args: &[&str], input: &[u8]) -> Output {
        let mut child = self
            .command(type_name, args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let mut stdin = child.stdin.take().unwrap();
        let input = input.to_vec();
        let feeder = std::thread::spawn(move || stdin.write_all(&input));
        let output = child.wait_with_output().expect("wait");
        feeder.join().unwrap().expect("write stdin");
        output
    }

    /// Run, expect success and nothing on stderr; the stdout.
    fn ok(&self, type_name: &str, args: &[&str]) -> String {
        succeeded(self.run(type_name, args), type_name, args)
    }

    /// Run, expect exit status `code`, nothing on stdout and one line on stderr; that line.
    fn fails(&self, type_name: &str, args: &[&str], code: i32) -> String {
        let out = self.run(type_name, args);
        failed(&out, code, &format!("{type_name} {args:?}"))
    }

    /// A bash script, with the object commands from `spindle shell-env`.
    fn bash(&self, script: &str) -> Output {
        let mut command = Command::new("bash");
        command
            .arg("-c")
            .arg(format!("eval \"$('{BIN}' shell-env)\"\n{script}"));
        self.environment(&mut command);
        command.output().expect("run bash")
    }

    fn spawn(&self, type_name: &str, args: &[&str]) -> Child {
        self.command(type_name, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn")
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn succeeded(out: Output, type_name: &str, args: &[&str]) -> String {
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "{type_name} {args:?}: {:?}, stderr {:?}",
        out.status,
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn failed(out: &Output, code: i32, what: &str) -> String {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{what}: stderr {stderr:?}");
    assert!(out.stdout.is_empty(), "{what}: stdout {:?}", text(&out.stdout));
    assert_eq!(stderr.lines().count(), 1, "{what}: one line on stderr: {stderr:?}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr.trim_end().to_string()
}

fn wait_output(child: Child) -> Output {
    child.wait_with_output().expect("wait")
}

/// Wait until a call is parked on `type_name` `key` (an exact probe, `common::ParkedProbe`),
/// while `children`, the processes that may park there, are still running: fails the test
/// if one of them exits first, or if nothing parks within a generous bound.
fn parks(server: &Server, children: &mut [&mut Child], type_name: &str, key: &str) {
    let mut probe = ParkedProbe::new(server, type_name, key);
    eventually(&format!("a call parks on {type_name} '{key}'"), || {
        for child in children.iter_mut() {
            if let Some(status) = child.try_wait().expect("try_wait") {
                panic!("a process exited ({status}) instead of waiting on {type_name} '{key}'");
            }
        }
        probe.parked()
    });
}

#[test]
fn the_issue_examples_print_what_crucial_printed() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    assert_eq!(sh.ok("counter", &["-n", "c", "reset"]), "");
    assert_eq!(sh.ok("counter", &["-n", "c", "increment", "-1", "1"]), "1\n");
    assert_eq!(sh.ok("counter", &["-n", "c", "increment", "-i", "5"]), "6\n");
    assert_eq!(sh.ok("counter", &["-n", "c", "tally"]), "6\n");

    let merge = ["-n", "M", "mergeAll", "-1", "1=1", "-1", "2=1", "-2", "sum"];
    assert_eq!(sh.ok("map", &merge), "");
    assert_eq!(sh.ok("map", &merge), "");
    assert_eq!(sh.ok("map", &["-n", "M", "get", "-1", "1"]), "2\n");
    assert_eq!(sh.ok("map", &["-n", "M", "keySet"]), "1\n2\n");

    // The shell typed the keys and values as numbers, as Python and every client see them.
    let mut conn = server.session("probe");
    assert_eq!(conn.call("Dict", "M", "getitem", vec![1.into()]), Ok(2.into()));
    assert_eq!(conn.call("Counter", "c", "get", vec![]), Ok(6.into()));
}

#[test]
fn crucials_own_test_script_runs_unchanged() {
    // serverless-shell's examples/tests-stateful.sh, each `sshell "CMD"` run here as CMD.
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let out = sh.bash(
        r#"
fail(){ echo "FAILURE" $1; exit 1; }
THREADS=4
[[ ! -z $(counter -n test reset; counter -n test increment -1 1 | grep "1") ]] || fail 1
[[ ! -z $(counter -n test increment -1 1 ) ]] || fail 2
[[ ! -z $(for i in $(seq 1 1 ${THREADS}); do counter -n test increment -1 1 & done; wait | tail -n 1 | grep $((THREADS+2))) ]] || fail 3
[[ ! -z $(BARRIER=b$RANDOM; for i in $(seq 1 1 ${THREADS}); do barrier -n ${BARRIER} -p ${THREADS} await & done | grep ${THREADS}) ]] || fail 4
[[ ! -z $(MAP=m$RANDOM; map -n ${MAP} mergeAll -1 "1=1" -1 "2=1" -2 sum; for i in $(map -n ${MAP} keySet); do echo "$i=$(map -n ${MAP} get -1 $i)"; done | grep "1=1") ]] || fail 5
[[ $(counter -n test tally) == $((THREADS+2)) ]] || fail 6
echo "ALL PASSED"
"#,
    );
    assert_eq!(text(&out.stdout), "ALL PASSED\n", "stderr: {}", text(&out.stderr));
}

#[test]
fn spindle_type_is_the_same_command_as_the_link() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let direct = |args: &[&str]| {
        let mut command = Command::new(BIN);
        command.args(args);
        sh.environment(&mut command);
        command.output().expect("run spindle")
    };
    assert_eq!(sh.ok("counter", &["-n", "both", "increment", "-i", "2"]), "2\n");
    let out = direct(&["counter", "-n", "both", "increment"]);
    assert_eq!(succeeded(out, "spindle counter", &[]), "3\n");
    for t in TYPES {
        let help = succeeded(direct(&[t, "--help"]), t, &["--help"]);
        assert!(
            help.starts_with(&format!("{t}: ")) && help.contains("Usage: "),
            "{help}"
        );
        assert!(help.contains("-n, --name NAME"), "{help}");
        assert_eq!(sh.ok(t, &["-h"]), help);
    }
    // The ordinary commands are untouched, and list the object commands.
    let help = succeeded(direct(&["--help"]), "spindle", &["--help"]);
    assert!(
        help.contains("shell-env") && help.contains("spindle counter|map"),
        "{help}"
    );
}

#[test]
fn counter_operations() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    assert_eq!(sh.ok("counter", &["-n", "k", "increment"]), "1\n");
    assert_eq!(sh.ok("counter", &["-n", "k", "decrement"]), "0\n");
    assert_eq!(sh.ok("counter", &["-n", "k", "decrement", "-i", "5"]), "-5\n");
    assert_eq!(sh.ok("counter", &["-n", "k", "increment", "-1", "-5"]), "-10\n");
    assert_eq!(sh.ok("counter", &["-n", "k", "set", "-1", "40"]), "");
    assert_eq!(sh.ok("counter", &["-n", "k", "get"]), "40\n");
    assert_eq!(
        sh.ok("counter", &["-n", "k", "compareAndSet", "-1", "41", "-2", "0"]),
        "false\n"
    );
    assert_eq!(
        sh.ok("counter", &["-n", "k", "compareAndSet", "-1", "40", "-2", "42"]),
        "true\n"
    );
    assert_eq!(sh.ok("counter", &["--name=k", "tally"]), "42\n");
    assert_eq!(sh.ok("counter", &["-nk", "increment", "--increment", "8"]), "50\n");
    // CRUCIAL's -c: the initial value of a new counter only.
    assert_eq!(sh.ok("counter", &["-n", "from10", "-c", "10", "increment"]), "11\n");
    assert_eq!(sh.ok("counter", &["-n", "from10", "-c", "99", "tally"]), "11\n");
    assert_eq!(sh.ok("counter", &["-n", "k", "delete"]), "");
    let mut conn = server.session("probe");
    assert_eq!(common::kind(conn.call("Counter", "k", "get", vec![])), "NotFound");
}

#[test]
fn map_operations() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let m = |args: &[&str]| sh.ok("map", &[&["-n", "m"], args].concat());
    assert_eq!(m(&["put", "-1", "a", "-2", "hello world"]), "");
    assert_eq!(m(&["put", "-1", "b", "-2", "2.5"]), "");
    assert_eq!(m(&["get", "-1", "a"]), "hello world\n");
    assert_eq!(m(&["get", "-1", "b"]), "2.5\n");
    assert_eq!(m(&["containsKey", "-1", "a"]), "true\n");
    assert_eq!(m(&["containsKey", "-a", "zzz"]), "false\n");
    assert_eq!(m(&["size"]), "2\n");
    assert_eq!(m(&["isEmpty"]), "false\n");
    assert_eq!(m(&["values"]), "hello world\n2.5\n");
    assert_eq!(m(&["entrySet"]), "a=hello world\nb=2.5\n");
    assert_eq!(m(&["merge", "-1", "b", "-2", "1", "-3", "sum"]), "3.5\n");
    assert_eq!(m(&["merge", "-1", "tags", "-2", "x", "-3", "append"]), "x\n");
    assert_eq!(m(&["merge", "-1", "tags", "-2", "y", "-3", "append"]), "x\ny\n");
    assert_eq!(
        m(&["get", "-1", "tags"]),
        "x\ny\n",
        "a list value prints one item per line"
    );
    assert_eq!(m(&["merge", "-1", "b", "-2", "7"]), "7\n", "replace by default");
    assert_eq!(m(&["mergeAll", "-1", "lo=5", "-1", "hi=5"]), "");
    assert_eq!(m(&["mergeAll", "-1", "lo=3", "-1", "hi=9", "-2", "min"]), "");
    assert_eq!(m(&["mergeAll", "-1", "lo=1", "-1", "hi=8", "-2", "max"]), "");
    assert_eq!(m(&["get", "-1", "lo"]), "3\n");
    assert_eq!(m(&["get", "-1", "hi"]), "8\n");
    assert_eq!(m(&["remove", "-1", "a"]), "hello world\n");
    assert_eq!(m(&["remove", "-1", "a"]), "");
    assert_eq!(m(&["list"]), "b=7\ntags=[x, y]\nlo=3\nhi=8\n");

    // A missing key prints nothing anywhere and exits 1, so `v=$(map get) || ...` works.
    let out = sh.run("map", &["-n", "m", "get", "-1", "a"]);
    assert_eq!((out.status.code(), out.stdout.len(), out.stderr.len()), (Some(1), 0, 0));

    assert_eq!(m(&["clear"]), "");
    assert_eq!(m(&["size"]), "0\n");
    assert_eq!(m(&["isEmpty"]), "true\n");
    let bad = sh.fails("map", &["-n", "m", "mergeAll", "-1", "novalue"], 2);
    assert!(bad.contains("KEY=VALUE"), "{bad}");
    let bad = sh.fails("map", &["-n", "m", "mergeAll", "-1", "a=1", "-2", "avg"], 2);
    assert!(bad.contains("unknown merge 'avg'"), "{bad}");
    assert!(sh.fails("map", &["-n", "m", "get"], 2).contains("get needs -1 KEY"));
    // Usage errors change nothing.
    assert_eq!(m(&["size"]), "0\n");
}

#[test]
fn treemap_lists_keys_in_order() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    for (k, v) in [("pear", "3"), ("apple", "1"), ("fig", "2"), ("banana", "5")] {
        sh.ok("treemap", &["-n", "t", "put", "-1", k, "-2", v]);
    }
    assert_eq!(sh.ok("treemap", &["-n", "t", "keySet"]), "apple\nbanana\nfig\npear\n");
    assert_eq!(sh.ok("treemap", &["-n", "t", "values"]), "1\n5\n2\n3\n");
    assert_eq!(
        sh.ok("treemap", &["-n", "t", "entrySet"]),
        "apple=1\nbanana=5\nfig=2\npear=3\n"
    );
    assert_eq!(sh.ok("treemap", &["-n", "t", "first"]), "apple=1\n");
    assert_eq!(sh.ok("treemap", &["-n", "t", "last"]), "pear=3\n");
    assert_eq!(
        sh.ok("treemap", &["-n", "t", "range", "-1", "b", "-2", "g"]),
        "banana=5\nfig=2\n"
    );
    // Numbers order as numbers.
    for k in ["10", "9", "100"] {
        sh.ok("treemap", &["-n", "nums", "put", "-1", k, "-2", "x"]);
    }
    assert_eq!(sh.ok("treemap", &["-n", "nums", "keySet"]), "9\n10\n100\n");
    let out = sh.run("treemap", &["-n", "empty", "first"]);
    assert_eq!((out.status.code(), out.stdout.len()), (Some(1), 0));
    // `first` is a treemap operation, not a map one.
    assert!(sh
        .fails("map", &["-n", "m", "first"], 2)
        .contains("unknown operation 'first'"));
}

#[test]
fn list_operations() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let l = |args: &[&str]| sh.ok("list", &[&["-n", "l"], args].concat());
    assert_eq!(l(&["add", "-1", "a"]), "true\n");
    assert_eq!(l(&["add", "-1", "b", "-1", "3", "-1", "a"]), "true\n");
    assert_eq!(l(&["size"]), "4\n");
    assert_eq!(l(&["list"]), "a\nb\n3\na\n");
    assert_eq!(l(&["all"]), "a\nb\n3\na\n");
    assert_eq!(l(&["get", "-1", "1"]), "b\n");
    assert_eq!(l(&["get", "-1", "-1"]), "a\n");
    assert_eq!(l(&["set", "-1", "0", "-2", "z"]), "");
    assert_eq!(l(&["contains", "-1", "3"]), "true\n");
    assert_eq!(l(&["contains", "-1", "nope"]), "false\n");
    assert_eq!(l(&["indexOf", "-1", "a"]), "3\n");
    assert_eq!(l(&["indexOf", "-1", "nope"]), "-1\n");
    assert_eq!(l(&["remove", "-1", "b"]), "true\n");
    assert_eq!(l(&["remove", "-1", "b"]), "false\n");
    assert_eq!(l(&["pop"]), "a\n");
    assert_eq!(l(&["list"]), "z\n3\n");
    assert_eq!(l(&["isEmpty"]), "false\n");
    let err = sh.fails("list", &["-n", "l", "get", "-1", "7"], 1);
    assert_eq!(err, "list: 'l' has no index 7");
    assert_eq!(l(&["clear"]), "");
    assert_eq!(sh.fails("list", &["-n", "l", "pop"], 1), "list: 'l' is empty");
    let mut conn = server.session("probe");
    conn.call("List", "l", "append", vec![3.into()]).unwrap();
    assert_eq!(
        conn.call("List", "l", "items", vec![]),
        Ok(Value::Array(vec![3.into()]))
    );
}

#[test]
fn a_barrier_of_four_processes_opens_together() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    // Flags before or after the operation: CRUCIAL's scripts use both orders.
    let mut parties: Vec<Child> = (0..3)
        .map(|i| match i % 2 {
            0 => sh.spawn("barrier", &["-n", "B", "-p", "4", "await"]),
            _ => sh.spawn("barrier", &["-n", "B", "await", "-p", "4"]),
        })
        .collect();
    let mut conn = server.session("probe");
    eventually("three parties wait", || {
        conn.call("Barrier", "B", "info", vec![])
            .is_ok_and(|info| common::field(&info, "n_waiting") == &Value::from(3))
    });
    for p in &mut parties {
        assert!(p.try_wait().unwrap().is_none(), "a party left before the fourth came");
    }
    parties.push(sh.spawn("barrier", &["--parties", "4", "-n", "B", "await"]));
    let mut arrivals: Vec<u32> = parties
        .into_iter()
        .map(|p| {
            let out = wait_output(p);
            succeeded(out, "barrier", &[])
                .trim()
                .parse()
                .expect("an arrival number")
        })
        .collect();
    arrivals.sort_unstable();
    assert_eq!(arrivals, [1, 2, 3, 4], "CRUCIAL numbers arrivals 1 to PARTIES");

    // Timeouts break it for everyone (as in threading); a barrier needs -p to be created.
    let started = Instant::now();
    let err = sh.fails("barrier", &["-n", "B2", "-p", "2", "await", "-t", "0.2"], 1);
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert!(
        err.starts_with("barrier: 'B2' is broken (timed out after 0.2 s"),
        "{err}"
    );
    let err = sh.fails("barrier", &["-n", "nowhere", "await"], 1);
    assert_eq!(err, "barrier: 'nowhere' does not exist: give -p PARTIES to create it");
    assert!(sh
        .fails("barrier", &["-n", "B3", "-p", "0", "await"], 2)
        .contains("-p needs"));
}

#[test]
fn rdv_hands_a_value_from_one_process_to_others() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let (mut first, mut second) = (sh.spawn("rdv", &["-n", "R"]), sh.spawn("rdv", &["R", "-t", "30"]));
    // A waiter is parked on the rendezvous (the probe cannot tell one from two), so the
    // value below wakes a waiting process rather than meeting one that has yet to ask.
    parks(&server, &mut [&mut first, &mut second], "Future", "R");
    let mut conn = server.session("probe");
    assert_eq!(conn.call("Future", "R", "done", vec![]), Ok(false.into()));
    let waiters = [first, second];
    // CRUCIAL's rewritten pipes publish an address with `rdv NAME -1 $IP`.
    assert_eq!(sh.ok("rdv", &["R", "-1", "10.0.0.7:8080"]), "");
    for w in waiters {
        assert_eq!(succeeded(wait_output(w), "rdv", &[]), "10.0.0.7:8080\n");
    }
    assert_eq!(
        sh.ok("rdv", &["-n", "R"]),
        "10.0.0.7:8080\n",
        "a later reader gets it at once"
    );
    assert_eq!(
        sh.fails("rdv", &["-n", "R", "-1", "again"], 1),
        "rdv: 'R' already has a value"
    );
    assert_eq!(
        sh.fails("rdv", &["-n", "R2", "-t", "0.1"], 1),
        "rdv: 'R2' has no value after 0.1 s"
    );
    assert_eq!(
        sh.fails("rdv", &["-1", "x"], 2),
        "rdv: missing the name: rdv NAME [-1 VALUE], or rdv -n NAME"
    );
}

#[test]
fn semaphore_permits_outlive_the_process_that_took_them() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    assert_eq!(sh.ok("semaphore", &["-n", "S", "-p", "2", "acquire"]), "");
    assert_eq!(sh.ok("semaphore", &["-n", "S", "acquire"]), "");
    // Both processes exited holding their permits: none came back.
    assert_eq!(sh.ok("semaphore", &["-n", "S", "available"]), "0\n");
    let err = sh.fails("semaphore", &["-n", "S", "acquire", "-t", "0.1"], 1);
    assert_eq!(err, "semaphore: 'S' has no free permit after 0.1 s");
    let mut waiter = sh.spawn("semaphore", &["-n", "S", "acquire"]);
    // The release must find the acquirer waiting, not arrive before it asked.
    parks(&server, &mut [&mut waiter], "Semaphore", "S");
    assert_eq!(sh.ok("semaphore", &["-n", "S", "release"]), "");
    assert_eq!(succeeded(wait_output(waiter), "semaphore", &[]), "");
    assert_eq!(sh.ok("semaphore", &["-n", "S", "available"]), "0\n");
    assert_eq!(sh.ok("semaphore", &["-n", "S", "release", "-1", "2"]), "");
    assert_eq!(sh.ok("semaphore", &["-n", "S", "available"]), "2\n");
    let mut conn = server.session("probe");
    assert_eq!(conn.call("Semaphore", "S", "value", vec![]), Ok(2.into()));
    // Without -p a new semaphore has one permit, as threading.Semaphore().
    assert_eq!(sh.ok("semaphore", &["-n", "one", "available"]), "1\n");
}

#[test]
fn latch_releases_its_waiters_at_zero() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let mut waiter = sh.spawn("latch", &["-n", "L", "-p", "2", "await"]);
    // The waiter waits before the count reaches zero (else its await would return at once).
    parks(&server, &mut [&mut waiter], "CountDownLatch", "L");
    assert_eq!(sh.ok("latch", &["-n", "L", "-p", "2", "count"]), "2\n");
    assert_eq!(sh.ok("latch", &["-n", "L", "countDown"]), "");
    assert_eq!(
        sh.fails("latch", &["-n", "L", "await", "-t", "0.1"], 1),
        "latch: 'L' is still counting after 0.1 s"
    );
    assert_eq!(sh.ok("latch", &["-n", "L", "count"]), "1\n");
    assert_eq!(sh.ok("latch", &["-n", "L", "countDown"]), "");
    assert_eq!(succeeded(wait_output(waiter), "latch", &[]), "");
    assert_eq!(sh.ok("latch", &["-n", "L", "await"]), "");
    assert_eq!(
        sh.fails("latch", &["-n", "nope", "await"], 1),
        "latch: 'nope' does not exist: give -p COUNT to create it"
    );
}

#[test]
fn queue_operations() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    assert_eq!(sh.ok("queue", &["-n", "Q", "put", "-1", "first", "-1", "2"]), "");
    assert_eq!(sh.ok("queue", &["-n", "Q", "size"]), "2\n");
    assert_eq!(sh.ok("queue", &["-n", "Q", "get"]), "first\n");
    assert_eq!(sh.ok("queue", &["-n", "Q", "get"]), "2\n");
    assert_eq!(
        sh.fails("queue", &["-n", "Q", "get", "-t", "0.1"], 1),
        "queue: 'Q' is empty"
    );
    let mut conn = server.session("probe");
    conn.call("Queue", "Q", "put", vec![Value::Array(vec![1.into(), "x".into()])])
        .unwrap();
    assert_eq!(sh.ok("queue", &["-n", "Q", "get"]), "[1, x]\n");
}

#[test]
fn a_parked_call_waits_past_the_clients_five_second_timeout() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let mut getter = sh.spawn("queue", &["-n", "slow", "get"]);
    parks(&server, &mut [&mut getter], "Queue", "slow");
    // Not a wait for a condition: the scenario is time passing. The get was sent before it
    // parked, so it has waited longer than the client's 5 s timeout when this sleep ends.
    std::thread::sleep(Duration::from_millis(6500));
    assert!(getter.try_wait().unwrap().is_none(), "the getter gave up waiting");
    assert!(
        ParkedProbe::new(&server, "Queue", "slow").parked(),
        "the get is still parked"
    );
    let mut conn = server.session("probe");
    conn.call("Queue", "slow", "put", vec!["late".into()]).unwrap();
    assert_eq!(succeeded(wait_output(getter), "queue", &[]), "late\n");
}

#[test]
fn blob_round_trips_bytes_exactly() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let bytes: Vec<u8> = (0..300_000u32).map(|i| (i * 7 % 256) as u8).collect();
    let out = sh.run_with_input("blob", &["-n", "bl", "put"], &bytes);
    assert_eq!(succeeded(out, "blob", &["put"]), "");
    assert_eq!(sh.ok("blob", &["-n", "bl", "size"]), "300000\n");
    let out = sh.run("blob", &["-n", "bl", "get"]);
    assert!(out.status.success());
    assert!(out.stdout == bytes, "blob get gives back the bytes put");
    let out = sh.run_with_input("blob", &["-n", "bl", "append"], b"\0tail");
    assert!(out.status.success());
    assert_eq!(sh.ok("blob", &["-n", "bl", "size"]), "300005\n");
    let mut conn = server.session("probe");
    let stored = conn
        .call("Blob", "bl", "read", vec![300_000.into(), 10.into()])
        .unwrap();
    assert_eq!(stored, Value::Binary(b"\0tail".to_vec()));
}

/// Pseudo-random bytes with newlines at irregular places, and a few lines longer than a chunk.
fn stream_bytes(len: usize) -> Vec<u8> {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let line = match state % 50 {
            0 => 70_000 + (state >> 40) as usize % 100_000,
            _ => (state >> 32) as usize % 3000,
        };
        out.extend((0..line).map(|i| (state.rotate_left(i as u32 % 64) as u8) | 0x80));
        out.push(b'\n');
    }
    out.truncate(len);
    out
}

#[test]
fn a_pipe_streams_mebibytes_exactly_with_back_pressure() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let input = stream_bytes(4 << 20);
    let mut writer = sh
        .command("pipe", &["-n", "P", "write"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = writer.stdin.take().unwrap();
    let feed = input.clone();
    let feeder = std::thread::spawn(move || stdin.write_all(&feed));
    // Back-pressure, whatever the machine's speed: with no reader yet, the writer fills the
    // pipe's 16 items and then waits, its put parked on the full queue. It cannot have
    // finished instead: 4 MiB is more than 16 chunks of at most 64 KiB.
    parks(&server, &mut [&mut writer], "Queue", "P");
    let mut conn = server.session("probe");
    assert_eq!(
        conn.call("Queue", "P", "qsize", vec![]),
        Ok(16.into()),
        "the writer waits on a full pipe"
    );
    // The reader: this test reads its stdout in small sips, the pipe never holding more.
    let mut reader = sh
        .command("pipe", &["-n", "P", "read"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = reader.stdout.take().unwrap();
    let mut got = Vec::new();
    let mut sip = [0u8; 16 * 1024];
    loop {
        let held = conn.call("Queue", "P", "qsize", vec![]).expect("the pipe's size");
        let held = held.as_u64().unwrap_or_else(|| panic!("qsize is a count: {held}"));
        assert!(held <= 16, "the pipe holds at most 16 chunks, held {held}");
        let n = stdout.read(&mut sip).unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&sip[..n]);
    }
    feeder.join().unwrap().unwrap();
    assert!(writer.wait().unwrap().success());
    assert!(reader.wait().unwrap().success());
    assert_eq!(got.len(), input.len());
    assert!(got == input, "the bytes come out as they went in");
}

#[test]
fn pipe_items_are_line_aligned_chunks_ended_by_nil() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    // Small enough to fit the queue without a reader: then read its items raw.
    let mut input = Vec::new();
    for n in [10, 40_000, 30_000, 100_000, 0, 5] {
        input.extend(vec![b'x'; n]);
        input.push(b'\n');
    }
    input.extend_from_slice(b"no final newline");
    let out = sh.run_with_input("pipe", &["-n", "raw", "write"], &input);
    assert_eq!(succeeded(out, "pipe", &["write"]), "");
    let mut conn = server.session("probe");
    assert_eq!(conn.call("Queue", "raw", "maxsize", vec![]), Ok(16.into()));
    let mut items = Vec::new();
    loop {
        match conn.call("Queue", "raw", "get", vec![false.into()]).expect("an item") {
            Value::Nil => break,
            Value::Binary(chunk) => items.push(chunk),
            other => panic!("a pipe item is bin or nil, got {other}"),
        }
    }
    assert_eq!(
        common::kind(conn.call("Queue", "raw", "get", vec![false.into()])),
        "Empty"
    );
    assert_eq!(items.concat(), input);
    for chunk in &items[..items.len() - 1] {
        // Whole lines, or a full chunk of a line longer than a chunk.
        assert!(chunk.len() <= 64 * 1024, "chunk of {}", chunk.len());
        assert!(
            chunk.ends_with(b"\n") || chunk.len() == 64 * 1024,
            "chunk of {}",
            chunk.len()
        );
    }
    assert!(
        items.iter().any(|c| c.len() == 64 * 1024),
        "the 100,000-byte line was split"
    );
    // The 40,000- and 30,000-byte lines are whole within chunks, never split.
    let mut offsets = vec![0];
    for chunk in &items {
        offsets.push(offsets.last().unwrap() + chunk.len());
    }
    let line_start = 11;
    for (start, len) in [(line_start, 40_001), (line_start + 40_001, 30_001)] {
        assert!(
            items
                .iter()
                .zip(&offsets)
                .any(|(c, &o)| o <= start && start + len <= o + c.len()),
            "the line at {start} lies in one chunk"
        );
    }
}

#[test]
fn a_deleted_pipe_ends_its_reader_and_a_closed_stdout_ends_it_quietly() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let mut reader = sh.spawn("pipe", &["-n", "gone", "read"]);
    // Once the reader waits on the pipe, deleting it ends the reader's wait.
    parks(&server, &mut [&mut reader], "Queue", "gone");
    assert_eq!(sh.ok("pipe", &["-n", "gone", "close"]), "");
    let out = wait_output(reader);
    assert_eq!(failed(&out, 1, "pipe read"), "pipe: pipe gone was closed");

    // `pipe read | head -2`: the reader's reader leaves; it ends with 141, like a shell, and
    // closes the pipe, so its writer (blocked on the full pipe) fails instead of waiting
    // forever (the loop only keeps a regression from hanging the test).
    let out = sh.bash(
        "seq 1 3000000 | pipe -n lines write & writer=$!
         pipe -n lines read | head -2; echo \"${PIPESTATUS[0]}\"
         for i in $(seq 600); do kill -0 $writer 2>/dev/null || break; sleep 0.1; done
         kill $writer 2>/dev/null && echo 'the writer hung'
         wait $writer; echo \"writer $?\"",
    );
    assert_eq!(
        text(&out.stdout),
        "1\n2\n141\nwriter 1\n",
        "stderr: {}",
        text(&out.stderr)
    );
    let stderr = text(&out.stderr);
    assert!(stderr.contains("pipe lines was closed"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn mistakes_are_one_line_with_status_2_and_failures_status_1() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    assert_eq!(
        sh.fails("counter", &["-n", "c", "incr"], 2),
        "counter: unknown operation 'incr' (operations: reset, increment, decrement, tally, set, compareAndSet, delete)"
    );
    assert_eq!(
        sh.fails("counter", &["increment"], 2),
        "counter: missing -n NAME (the object's name)"
    );
    assert_eq!(
        sh.fails("counter", &["-n", "c"], 2),
        "counter: missing operation (operations: reset, increment, decrement, tally, set, compareAndSet, delete)"
    );
    assert_eq!(
        sh.fails("counter", &["-n", "c", "increment", "-i", "many"], 2),
        "counter: the increment must be an integer, got 'many'"
    );
    assert_eq!(
        sh.fails("counter", &["-n", "c", "increment", "-1", "1.5"], 2),
        "counter: the increment must be an integer, got '1.5'"
    );
    assert_eq!(
        sh.fails("counter", &["-n", "c", "increment", "-x", "1"], 2),
        "counter: unknown option '-x' (see counter --help)"
    );
    assert_eq!(
        sh.fails("counter", &["-n", "c", "tally", "extra"], 2),
        "counter: unexpected argument 'extra' (see counter --help)"
    );
    assert_eq!(sh.fails("counter", &["-n"], 2), "counter: -n needs a value");
    assert_eq!(
        sh.fails("barrier", &["-n", "b", "await", "-t", "soon"], 2),
        "barrier: -t needs a non-negative number of seconds, got 'soon'"
    );
    // None of those reached the server.
    let mut conn = server.session("probe");
    assert_eq!(common::kind(conn.call("Counter", "c", "get", vec![])), "NotFound");

    // Another type under the name: the server's TypeMismatch.
    sh.ok("map", &["-n", "shared", "put", "-1", "k", "-2", "v"]);
    assert_eq!(
        sh.fails("counter", &["-n", "shared", "increment"], 1),
        "counter: 'shared' is a Dict, not a Counter"
    );
    assert_eq!(
        sh.fails("counter", &["-n", "shared", "delete"], 1),
        "counter: 'shared' is a Dict, not a Counter"
    );
    assert_eq!(sh.ok("map", &["-n", "shared", "get", "-1", "k"]), "v\n");

    // An unknown type, through `spindle`.
    let mut command = Command::new(BIN);
    command.args(["countr", "-n", "c", "increment"]);
    sh.environment(&mut command);
    let err = failed(&command.output().unwrap(), 2, "spindle countr");
    assert!(
        err.starts_with("spindle: unknown command or object type 'countr' (object types: counter, map,"),
        "{err}"
    );

    // No server: the first of a list that answers is used; none answering is status 1.
    let closed = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().to_string()
    };
    let nowhere = Shell::at(&closed);
    let err = nowhere.fails("counter", &["-n", "c", "tally"], 1);
    assert!(
        err.starts_with(&format!("counter: no Spindle server at {closed}")),
        "{err}"
    );
    let fallback = Shell::at(&format!("{closed}, {}", server.address));
    assert_eq!(fallback.ok("counter", &["-n", "c", "increment"]), "1\n");
}

#[test]
fn shell_env_makes_plain_commands_that_call_this_binary() {
    let server = Server::start(&[]);
    let sh = Shell::new(&server);
    let out = Command::new(BIN).arg("shell-env").output().unwrap();
    let env = succeeded(out, "spindle", &["shell-env"]);
    for t in TYPES {
        assert!(env.contains(&format!("{t}() {{ '{BIN}' {t} \"$@\"; }}")), "{env}");
    }
    // Exported (bash), the functions reach child shells.
    let out = sh.bash("counter -n e increment -i 3 && bash -c 'counter -n e tally'");
    assert_eq!(text(&out.stdout), "3\n3\n", "stderr: {}", text(&out.stderr));

    // A path with a quote and a space is quoted safely.
    let dir = sh.dir.join("it's here");
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("spindle");
    std::fs::hard_link(BIN, &copy)
        .or_else(|_| std::fs::copy(BIN, &copy).map(drop))
        .unwrap();
    let mut command = Command::new("bash");
    command.arg("-c").arg(format!(
        "eval \"$('{}' shell-env)\" && type counter >/dev/null && counter -n e tally",
        copy.display().to_string().replace('\'', "'\\''")
    ));
    sh.environment(&mut command);
    let out = command.output().unwrap();
    assert_eq!(text(&out.stdout), "3\n", "stderr: {}", text(&out.stderr));
}
