//! Data that flows: `queue` (a `Queue` of values), `pipe` (bytes streamed between processes
//! through a bounded `Queue`) and `blob` (bytes stored whole, a `Blob`).
//!
//! A pipe is a named `Queue` created with maxsize [`PIPE_ITEMS`] (a writer waits while it
//! is full: back-pressure), whose items are `bin` chunks of at most [`CHUNK`] bytes cut on
//! line boundaries (a line is split only when it is longer than a chunk), ended by one `nil`.
//! `spindle sh` relies on exactly this.

use std::io::{self, ErrorKind, Read};
use std::os::fd::FromRawFd;

use spindle_core::Value;

use super::args::{flag, long_flag, typed, Slot};
use super::output::BROKEN_PIPE;
use super::{Exit, Invocation, Object, Op, Out, Outcome, Spec, DELETE};
use crate::client::Failure;

/// Items a pipe's queue holds at most.
pub(crate) const PIPE_ITEMS: i64 = 16;
/// Largest chunk of a pipe, in bytes.
pub(crate) const CHUNK: usize = 64 * 1024;

pub(crate) static QUEUE: Spec = Spec {
    name: "queue",
    spindle: "Queue",
    about: "a shared FIFO queue of values",
    ops: &[
        Op {
            name: "put",
            aliases: &["add", "offer"],
            usage: "-1 VALUE [-1 VALUE ...]",
            help: "append the values, one item each",
        },
        Op {
            name: "get",
            aliases: &["take", "poll"],
            usage: "[-t SECONDS]",
            help: "remove the oldest item and print it, waiting for one (status 1 on timeout)",
        },
        Op {
            name: "size",
            aliases: &[],
            usage: "",
            help: "print the number of items",
        },
        DELETE,
    ],
    flags: &[
        flag(Slot::One, "-1", "VALUE", "an item to put"),
        long_flag(
            Slot::Timeout,
            "-t",
            "--timeout",
            "SECONDS",
            "give up after this long (status 1)",
        ),
    ],
    notes: "Example: queue -n jobs put -1 a -1 b; while job=$(queue -n jobs get -t 1); do ...; done",
    run: run_queue,
};

fn run_queue(inv: &Invocation, queue: &mut Object, out: &mut Out) -> Outcome {
    let timeout = inv.timeout()?;
    let items: Vec<Value> = inv.values(Slot::One).iter().map(|v| typed(v)).collect();
    if inv.op == "put" && items.is_empty() {
        return Err(Exit::Usage("put needs -1 VALUE".into()));
    }
    queue.ensure(vec![])?;
    match inv.op {
        // A bounded queue (made by a program) may be full: put waits, as queue.Queue's does.
        "put" => items.into_iter().try_for_each(|item| {
            queue
                .call_waiting("put", vec![item], None)
                .map(drop)
                .map_err(|e| queue.error(e))
        }),
        "get" => {
            let args = vec![true.into(), timeout.map_or(Value::Nil, Value::F64)];
            match queue.call_waiting("get", args, timeout) {
                Ok(item) => out.line(&item),
                Err(e) if Object::is(&e, "Empty") => Err(Exit::Error(format!("'{}' is empty", queue.key))),
                Err(e) => Err(queue.error(e)),
            }
        }
        "size" => out.line(&queue.ask("qsize", vec![])?),
        other => unreachable!("queue operation {other}"),
    }
}

pub(crate) static PIPE: Spec = Spec {
    name: "pipe",
    spindle: "Queue",
    about: "a named pipe between processes on any machine",
    ops: &[
        Op {
            name: "write",
            aliases: &[],
            usage: "",
            help: "copy stdin into the pipe, then close it (the reader sees the end)",
        },
        Op {
            name: "read",
            aliases: &[],
            usage: "",
            help: "copy the pipe to stdout until the writer closed it",
        },
        Op {
            name: "delete",
            aliases: &["close"],
            usage: "",
            help: "delete the pipe: a reader or writer still at it fails",
        },
    ],
    flags: &[],
    notes: "Example: producer | pipe -n p write & pipe -n p read | consumer",
    run: run_pipe,
};

fn run_pipe(inv: &Invocation, pipe: &mut Object, out: &mut Out) -> Outcome {
    pipe.ensure(vec![PIPE_ITEMS.into()])?;
    let closed = |pipe: &Object, e: Failure| match Object::is_gone(&e) {
        true => Exit::Error(format!("pipe {} was closed", pipe.key)),
        false => pipe.error(e),
    };
    match inv.op {
        "write" => {
            // Unbuffered fd 0: `stdin_ready` polls it, so no bytes may wait in a buffer above it.
            // SAFETY: fd 0 stays open for the process's life; ManuallyDrop never closes it.
            let stdin = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(0) });
            let mut chunks = Chunks::new(&*stdin, stdin_ready);
            loop {
                let chunk = chunks
                    .next_chunk()
                    .map_err(|e| Exit::Error(format!("cannot read stdin: {e}")))?;
                let last = chunk.is_none();
                let item = chunk.map_or(Value::Nil, Value::Binary);
                pipe.call_waiting("put", vec![item], None)
                    .map_err(|e| closed(pipe, e))?;
                if last {
                    return Ok(());
                }
            }
        }
        "read" => {
            let mut copy = || loop {
                match pipe.call_waiting("get", vec![], None).map_err(|e| closed(pipe, e))? {
                    Value::Nil => return Ok(()),
                    Value::Binary(bytes) => out.raw(&bytes)?,
                    Value::String(text) => out.raw(text.as_bytes())?,
                    other => out.line(&other)?,
                }
                // Whoever reads our stdout sees each chunk as it comes.
                out.flush()?;
            };
            let copied = copy();
            if matches!(copied, Err(Exit::Silent(BROKEN_PIPE))) {
                // Our reader went away: close the pipe, so its writer fails (as a local
                // writer gets SIGPIPE) instead of waiting forever on a full pipe.
                let _ = pipe.delete();
            }
            copied
        }
        other => unreachable!("pipe operation {other}"),
    }
}

/// Whether stdin has bytes (or its end) to read right now.
pub(crate) fn stdin_ready() -> bool {
    let mut fd = libc::pollfd {
        fd: 0,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, a zero timeout.
    unsafe { libc::poll(&mut fd, 1, 0) > 0 }
}

/// A byte stream cut into pipe chunks: at most [`CHUNK`] bytes, ending at a newline unless
/// a line is longer than a chunk. Complete lines are sent as soon as no more input is waiting
/// (a slow producer's lines are not held back), a partial line only with the rest of it, a
/// full chunk or the end.
pub(crate) struct Chunks<R, F> {
    input: R,
    ready: F,
    buf: Vec<u8>,
    eof: bool,
}

impl<R: Read, F: FnMut() -> bool> Chunks<R, F> {
    pub fn new(input: R, ready: F) -> Self {
        Chunks {
            input,
            ready,
            buf: Vec::with_capacity(CHUNK),
            eof: false,
        }
    }

    /// The next chunk, or `None` at the end of the input.
    pub fn next_chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        loop {
            if self.buf.len() >= CHUNK {
                let cut = last_line_end(&self.buf[..CHUNK]).unwrap_or(CHUNK);
                return Ok(Some(self.buf.drain(..cut).collect()));
            }
            if self.eof {
                return Ok((!self.buf.is_empty()).then(|| std::mem::take(&mut self.buf)));
            }
            if let Some(cut) = last_line_end(&self.buf) {
                if !(self.ready)() {
                    return Ok(Some(self.buf.drain(..cut).collect()));
                }
            }
            let start = self.buf.len();
            self.buf.resize(CHUNK, 0);
            match self.input.read(&mut self.buf[start..]) {
                Ok(n) => {
                    self.buf.truncate(start + n);
                    self.eof = n == 0;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => self.buf.truncate(start),
                Err(e) => {
                    self.buf.truncate(start);
                    return Err(e);
                }
            }
        }
    }
}

/// The length of `bytes` up to and including its last newline.
fn last_line_end(bytes: &[u8]) -> Option<usize> {
    bytes.iter().rposition(|&b| b == b'\n').map(|i| i + 1)
}

pub(crate) static BLOB: Spec = Spec {
    name: "blob",
    spindle: "Blob",
    about: "shared bytes, stored whole",
    ops: &[
        Op {
            name: "put",
            aliases: &["set"],
            usage: "",
            help: "store stdin",
        },
        Op {
            name: "append",
            aliases: &[],
            usage: "",
            help: "append stdin",
        },
        Op {
            name: "get",
            aliases: &[],
            usage: "",
            help: "write the bytes to stdout",
        },
        Op {
            name: "size",
            aliases: &[],
            usage: "",
            help: "print the number of bytes",
        },
        DELETE,
    ],
    flags: &[],
    notes: "A blob travels in one message: up to the server's --max-frame (64 MiB by default).\n\
Example: tar c data | blob -n archive put; blob -n archive get | tar x",
    run: run_blob,
};

fn run_blob(inv: &Invocation, blob: &mut Object, out: &mut Out) -> Outcome {
    let input = match inv.op {
        "put" | "append" => {
            let mut bytes = Vec::new();
            io::stdin()
                .lock()
                .read_to_end(&mut bytes)
                .map_err(|e| Exit::Error(format!("cannot read stdin: {e}")))?;
            Some(Value::Binary(bytes))
        }
        _ => None,
    };
    blob.ensure(vec![])?;
    match inv.op {
        "put" => blob.ask("set", input.into_iter().collect()).map(drop),
        "append" => blob.ask("append", input.into_iter().collect()).map(drop),
        "get" => match blob.ask("get", vec![])? {
            Value::Binary(bytes) => out.raw(&bytes),
            other => out.line(&other),
        },
        "size" => out.line(&blob.ask("len", vec![])?),
        other => unreachable!("blob operation {other}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Cut `input` delivered in `pieces`-byte reads, with `ready` saying whether more waits.
    fn cut(input: &[u8], pieces: usize, ready: bool) -> Vec<Vec<u8>> {
        struct Trickle<'a>(&'a [u8], usize);
        impl Read for Trickle<'_> {
            fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
                let n = self.0.len().min(buf.len()).min(self.1);
                buf[..n].copy_from_slice(&self.0[..n]);
                self.0 = &self.0[n..];
                Ok(n)
            }
        }
        let mut chunks = Chunks::new(Trickle(input, pieces), || ready);
        std::iter::from_fn(|| chunks.next_chunk().unwrap()).collect()
    }

    fn lines(sizes: &[usize]) -> Vec<u8> {
        let mut out = Vec::new();
        for (i, &n) in sizes.iter().enumerate() {
            out.extend(vec![b'a' + (i % 26) as u8; n]);
            out.push(b'\n');
        }
        out
    }

    #[test]
    fn lines_are_never_split_unless_longer_than_a_chunk() {
        let input = lines(&[10, 40_000, 30_000, 65_535, 65_536, 200_000, 5, 0, 70_000]);
        for (pieces, ready) in [(usize::MAX, true), (4096, true), (1000, false), (1, false)] {
            let chunks = cut(&input, pieces, ready);
            assert_eq!(chunks.concat(), input, "pieces {pieces}");
            let mut at_line_start = true;
            for chunk in &chunks {
                assert!(!chunk.is_empty() && chunk.len() <= CHUNK);
                if chunk.len() < CHUNK {
                    assert!(chunk.ends_with(b"\n"), "a short chunk ends a line");
                }
                // A chunk that starts a line and is full either ends one or is a long line.
                if at_line_start && chunk.len() == CHUNK && !chunk.ends_with(b"\n") {
                    assert!(!chunk.contains(&b'\n'), "only a line longer than a chunk is split");
                }
                at_line_start = chunk.ends_with(b"\n");
            }
        }
    }

    #[test]
    fn bulk_input_fills_chunks_and_a_partial_last_line_is_kept() {
        let mut input = lines(&[99; 2000]);
        input.extend_from_slice(b"no newline at the end");
        let chunks = cut(&input, usize::MAX, true);
        assert_eq!(chunks.concat(), input);
        assert!(
            chunks.len() <= input.len() / (CHUNK - 100) + 1,
            "{} chunks",
            chunks.len()
        );
        assert!(chunks.last().unwrap().ends_with(b"the end"));
        assert!(cut(b"", 10, true).is_empty());
    }
}
