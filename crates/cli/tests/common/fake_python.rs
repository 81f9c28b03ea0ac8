//! A stand-in for Python: `--python` points at a shell script that ignores
//! `-m spindle.worker` / `-m spindle.host`, tells the test its pid and secret through a fifo,
//! and then does what the test needs (wait for an exit code, sleep, eat memory). The test
//! itself speaks the worker or host protocol on the process's behalf.

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::Duration;

/// How long to wait for a stand-in process to announce itself before failing the test.
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(30);

/// A directory holding the stand-in `python` and the fifo it announces processes on.
pub struct FakePython {
    dir: PathBuf,
    announced: mpsc::Receiver<String>,
}

/// A started stand-in process, as it announced itself.
pub struct Announced {
    pub pid: u32,
    /// `$SPINDLE_WORKER_ID` or `$SPINDLE_HOST_ID`.
    pub secret: String,
    /// `$SPINDLE_TOKEN` as the process saw it ("-" when unset).
    pub token: String,
}

impl FakePython {
    /// `behaviour` is shell run after the announcement; `$EXIT` names a fifo the test can
    /// write an exit code to.
    pub fn new(behaviour: &str) -> FakePython {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "spindle-functions-{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).expect("temp dir");
        let announce = dir.join("announce");
        mkfifo(&announce);
        let script = format!(
            "#!/bin/sh\n\
             # Stands in for `python -m spindle.worker` or `spindle.host` (arguments ignored).\n\
             EXIT='{dir}/exit.'$$\n\
             mkfifo \"$EXIT\"\n\
             echo \"$$ ${{SPINDLE_WORKER_ID:-$SPINDLE_HOST_ID}} ${{SPINDLE_TOKEN:--}}\" > '{dir}/announce'\n\
             {behaviour}\n",
            dir = dir.display()
        );
        let python = dir.join("python");
        fs::write(&python, script).expect("write the script");
        fs::set_permissions(&python, fs::Permissions::from_mode(0o755)).expect("chmod");
        // Opened read-write so the fifo never reports end of file between workers.
        let fifo = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&announce)
            .expect("open the fifo");
        let (tx, announced) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(fifo).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        FakePython { dir, announced }
    }

    /// A worker that exits with whatever code the test writes to its fifo.
    pub fn waiting() -> FakePython {
        FakePython::new("read code < \"$EXIT\"\nexit \"$code\"")
    }

    pub fn path(&self) -> String {
        self.dir.join("python").display().to_string()
    }

    /// The next worker the server started.
    pub fn next(&self) -> Announced {
        let line = self
            .announced
            .recv_timeout(ANNOUNCE_TIMEOUT)
            .expect("the server starts a worker");
        let mut parts = line.split(' ');
        let mut part = || parts.next().expect("announcement: pid secret token").to_string();
        Announced {
            pid: part().parse().expect("pid"),
            secret: part(),
            token: part(),
        }
    }

    /// Make worker `pid` exit with `code`.
    pub fn exit(&self, pid: u32, code: i32) {
        let mut fifo = fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join(format!("exit.{pid}")))
            .expect("open the exit fifo");
        writeln!(fifo, "{code}").expect("write the exit code");
    }
}

impl Drop for FakePython {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn mkfifo(path: &std::path::Path) {
    let status = Command::new("mkfifo").arg(path).status().expect("run mkfifo");
    assert!(status.success());
}
