//! `spindle sh "COMMAND"`: run a shell command as a function (the `shell` runtime of the
//! server's gateway) and stream its stdout and stderr back as it runs, through a `Queue` of
//! the state tier; exit with the command's exit status. docs/shell.md ("spindle sh").
//!
//! One connection carries everything, pipelined: the stream queue's `create`, the `invoke`s,
//! and one blocking `get` at a time on the stream. A failed invocation (timeout, crash)
//! withdraws the parked `get`, drains what is left without blocking, and ends with the error,
//! so the client never waits on a dead function.

use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use spindle_core::Value;

use crate::client::{field, random_bytes, remote, Client, Failure};
use crate::objects::streams::{stdin_ready, Chunks, PIPE_ITEMS};

/// Items the output stream may hold before the function's writes wait for this client.
const STREAM_ITEMS: i64 = 64;

/// Exit statuses of `spindle sh` itself (the command's own otherwise).
const EXIT_TIMEOUT: u8 = 124;
const EXIT_FAILED: u8 = 255;
const EXIT_USAGE: u8 = 2;

#[derive(Args)]
#[command(
    after_help = "The command runs with `bash -c` in $SPINDLE_FS, with the shared objects as commands \
    (counter, map, queue, pipe, ...) on its PATH. Its stdout and stderr stream back as it runs; the exit \
    status is the command's (124: --timeout expired; 255: the function could not run). \
    Several COMMAND words are joined with spaces, as ssh does."
)]
pub(crate) struct ShArgs {
    /// Start the command, print its call id on stderr (for spindle ps, logs, kill) and
    /// return at once; it keeps running after this process exits (at most 15 minutes,
    /// unless --timeout says otherwise) and its output is dropped.
    #[arg(long = "async")]
    detach: bool,
    /// Run this script file (its contents are sent); the COMMAND words are its arguments.
    #[arg(short = 'f', long = "file", value_name = "SCRIPT")]
    script: Option<PathBuf>,
    /// Print the request id, and the duration and memory of the function, on stderr.
    #[arg(short, long)]
    verbose: bool,
    /// Kill the function after this many seconds.
    #[arg(long, value_name = "SECONDS")]
    timeout: Option<f64>,
    /// Kill the function when its worker's resident memory passes this many MiB
    /// [default: the server's --memory-limit].
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    memory: Option<u64>,
    /// Run each stage of `A | B | C` in its own function, streaming bytes between them
    /// through the state tier (the exit status is that of the last failing stage, as with
    /// `set -o pipefail`).
    #[arg(long)]
    pipe: bool,
    /// Send this process's stdin to the command (else it reads an empty stdin).
    #[arg(short = 'i', long = "stdin")]
    stdin: bool,
    /// Set an environment variable for the command (repeatable).
    #[arg(short = 'e', long = "env", value_name = "NAME=VALUE")]
    env: Vec<String>,
    /// Server address [default: $SPINDLE_ADDRESS or 127.0.0.1:7070].
    #[arg(long, env = "SPINDLE_ADDRESS", default_value = crate::DEFAULT_ADDRESS, hide_env = true, hide_default_value = true)]
    address: String,
    /// The command line (or, with -f, the script's arguments).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// `spindle sh`.
pub(crate) fn run(args: ShArgs) -> ExitCode {
    // Like any filter: a reader that went away (`spindle sh ... | head -1`) ends us quietly.
    // SAFETY: signal(2) with a standard disposition; no handler code runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    match sh(args) {
        Ok(code) => ExitCode::from(code),
        Err(Fail { message, code }) => {
            eprintln!("spindle sh: {message}");
            ExitCode::from(code)
        }
    }
}

/// Why `spindle sh` ends without the command's exit status.
struct Fail {
    message: String,
    code: u8,
}

impl Fail {
    fn new(message: impl Into<String>, code: u8) -> Fail {
        Fail {
            message: message.into(),
            code,
        }
    }
}

impl From<Failure> for Fail {
    fn from(f: Failure) -> Fail {
        Fail::new(f.to_string(), EXIT_FAILED)
    }
}

impl From<String> for Fail {
    fn from(message: String) -> Fail {
        Fail::new(message, EXIT_FAILED)
    }
}

/// What one function runs.
struct Stage {
    command: String,
    stdin: Option<String>,
    stdout: Option<String>,
}

fn sh(args: ShArgs) -> Result<u8, Fail> {
    let usage = |m: &str| Fail::new(m, EXIT_USAGE);
    let (command, script, script_args) = match &args.script {
        Some(path) => {
            let bytes = std::fs::read(path).map_err(|e| Fail::new(format!("{}: {e}", path.display()), EXIT_USAGE))?;
            (String::new(), Some(bytes), args.command.clone())
        }
        None => (args.command.join(" "), None, Vec::new()),
    };
    if script.is_none() && command.trim().is_empty() {
        return Err(usage("nothing to run: spindle sh \"COMMAND\" (see spindle sh --help)"));
    }
    let commands = if args.pipe {
        if script.is_some() {
            return Err(usage("--pipe splits a command line; it does not take -f"));
        }
        split_pipeline(&command).map_err(|e| usage(&e))?
    } else {
        vec![command]
    };
    if args.detach && (commands.len() > 1 || args.stdin) {
        return Err(usage(
            "--async runs one command without input: drop --pipe (bash runs the pipe in one function) or --stdin",
        ));
    }
    let mut env = vec![];
    for pair in &args.env {
        let (name, value) = pair
            .split_once('=')
            .filter(|(name, _)| !name.is_empty())
            .ok_or_else(|| usage(&format!("-e takes NAME=VALUE, not '{pair}'")))?;
        env.push((Value::from(name), Value::from(value)));
    }
    let request_id = request_id();
    env.push(("SPINDLE_REQUEST_ID".into(), request_id.as_str().into()));
    let mut options = vec![("label".into(), request_id.as_str().into())];
    // What `spindle ps` shows of the call (the server cuts it to 120 bytes).
    let function = match &args.script {
        Some(path) => path.display().to_string(),
        None => commands.join(" | "),
    };
    options.push(("function".into(), function.into()));
    options.push(("caller".into(), format!("spindle sh pid {}", std::process::id()).into()));
    if let Some(timeout) = args.timeout {
        if !(timeout.is_finite() && timeout > 0.0) {
            return Err(usage("--timeout takes a positive number of seconds"));
        }
        options.push(("timeout".into(), Value::F64(timeout)));
    }
    if let Some(mb) = args.memory {
        options.push(("memory_mb".into(), mb.into()));
    }
    if args.detach {
        // Live: the server then tells the call's number at once, which we print.
        options.push(("detach".into(), true.into()));
        options.push(("live".into(), true.into()));
    }
    let cwd = std::env::current_dir()
        .map(|d| Value::from(d.to_string_lossy().into_owned()))
        .unwrap_or(Value::Nil);

    let mut client = Client::connect(&args.address)?;
    if commands.len() > 1 {
        // Every stage runs at once (each reads the one before): with fewer workers than
        // stages, the last ones would wait for a worker forever.
        let status = client.status()?;
        let workers = field(&status, "max_workers").and_then(Value::as_u64);
        if let Some(workers) = workers.filter(|&w| w < commands.len() as u64) {
            return Err(usage(&format!(
                "--pipe runs each of the {} stages in a function of its own, all at once, but the server runs at \
                 most {workers} (its --max-workers): drop --pipe to run the pipe in one function",
                commands.len()
            )));
        }
    }
    if args.verbose {
        eprintln!("RequestId: {request_id}");
    }
    let payload = |stage: &Stage, stream: Option<&str>| {
        let key = |k: Option<&str>| k.map_or(Value::Nil, Value::from);
        let map = Value::Map(vec![
            ("command".into(), stage.command.as_str().into()),
            ("script".into(), script.clone().map_or(Value::Nil, Value::Binary)),
            (
                "args".into(),
                Value::Array(script_args.iter().map(|a| a.as_str().into()).collect()),
            ),
            ("stream".into(), key(stream)),
            ("stdin".into(), key(stage.stdin.as_deref())),
            ("stdout".into(), key(stage.stdout.as_deref())),
            ("cwd".into(), cwd.clone()),
            ("env".into(), Value::Map(env.clone())),
        ]);
        let mut bytes = Vec::new();
        rmpv::encode::write_value(&mut bytes, &map).expect("encoding into a Vec");
        bytes
    };

    if args.detach {
        let stage = Stage {
            command: commands[0].clone(),
            stdin: None,
            stdout: None,
        };
        return start_detached(&mut client, payload(&stage, None), Value::Map(options));
    }

    // Unnamed queues: the output stream, then one pipe between each two stages. In a
    // cluster they are numbered so that they live in shards this connection's node leads:
    // the pipelined requests below reach their leader with no redirect.
    let led = client.shards_led_here()?;
    let mut next_key = 0;
    let mut unnamed = || loop {
        next_key += 1;
        let key = client.unnamed_key(next_key);
        if led
            .as_ref()
            .is_none_or(|(shards, mine)| mine.contains(&spindle_server::shard_of(&key, *shards)))
        {
            return key;
        }
    };
    let stream = unnamed();
    let pipes: Vec<String> = (1..commands.len()).map(|_| unnamed()).collect();
    let stdin = if args.stdin {
        Some(forward_stdin(&args.address)?)
    } else {
        None
    };
    let stages: Vec<Stage> = commands
        .into_iter()
        .enumerate()
        .map(|(k, command)| Stage {
            command,
            stdin: if k == 0 {
                stdin.clone()
            } else {
                Some(pipes[k - 1].clone())
            },
            stdout: pipes.get(k).cloned(),
        })
        .collect();
    let mut run = Run {
        stream: stream.clone(),
        pipes: pipes.clone(),
        creates: Vec::new(),
        invokes: Vec::new(),
        reports: Vec::new(),
        get: None,
        nils: 0,
        failed: None,
    };
    for (key, items) in std::iter::once((&stream, STREAM_ITEMS)).chain(pipes.iter().map(|p| (p, PIPE_ITEMS))) {
        let seq = client.call_seq();
        let id = client.send(
            "create",
            vec![
                seq,
                0.into(),
                "Queue".into(),
                key.as_str().into(),
                Value::Array(vec![items.into()]),
                true.into(),
            ],
        )?;
        run.creates.push(id);
    }
    for stage in &stages {
        let id = client.send(
            "invoke",
            vec![
                "shell".into(),
                Value::Binary(payload(stage, Some(&stream))),
                Value::Map(options.clone()),
            ],
        )?;
        run.invokes.push(id);
        run.reports.push(None);
    }
    let streamed = run.stream_to_end(&mut client);
    // The queues would go with our session anyway; deleting them now frees them at once.
    // Nobody waits for these replies: the server reads the requests before our connection's end.
    for key in std::iter::once(&stream).chain(if run.failed.is_some() { &[][..] } else { &pipes[..] }) {
        let seq = client.call_seq();
        let _ = client.send("delete", vec![seq, key.as_str().into()]);
    }
    streamed?;
    if let Some(message) = run.failed.take() {
        return Err(message);
    }
    let mut status = 0;
    for report in run.reports.iter().flatten() {
        if args.verbose {
            let duration = field(report, "duration").and_then(Value::as_f64).unwrap_or(0.0);
            let rss = field(report, "peak_rss").and_then(Value::as_u64).unwrap_or(0);
            eprintln!(
                "Duration: {} ms Memory Used: {} MB",
                (duration * 1000.0).ceil() as u64,
                rss.div_ceil(1 << 20)
            );
        }
        let code = field(report, "result")
            .and_then(Value::as_i64)
            .unwrap_or(i64::from(EXIT_FAILED));
        if code != 0 {
            status = code; // pipefail: the last failing stage's
        }
    }
    Ok(u8::try_from(status & 0xff).unwrap_or(EXIT_FAILED))
}

/// `--async`: send the invocation, detached, and return once the server took it (a `ping`
/// answered after it means it was queued, or refused: its error comes first), printing
/// the call's number on stderr (`CallId: N`) for `spindle ps`, `logs` and `kill`.
fn start_detached(client: &mut Client, payload: Vec<u8>, options: Value) -> Result<u8, Fail> {
    let invoke = client.send("invoke", vec!["shell".into(), Value::Binary(payload), options])?;
    let ping = client.send("ping", vec![])?;
    loop {
        let (id, status, value) = client.receive_frame()?;
        if id == invoke {
            match status {
                0 => {}
                2 => {
                    if let Some(call) = field(&value, "call").and_then(Value::as_u64) {
                        eprintln!("CallId: {call}");
                    }
                }
                _ => return Err(invocation_failed(&value)),
            }
        } else if id == ping {
            return Ok(0);
        }
    }
}

/// The state of a synchronous run: stream queue, pipes and invocations in flight.
struct Run {
    stream: String,
    pipes: Vec<String>,
    creates: Vec<u64>,
    invokes: Vec<u64>,
    /// Each stage's report, once in.
    reports: Vec<Option<Value>>,
    /// The parked `get` on the stream, if one is out.
    get: Option<u64>,
    /// Stages whose output ended (each puts one nil at the end).
    nils: usize,
    /// The first failure: the run ends once what the stream holds is drained.
    failed: Option<Fail>,
}

impl Run {
    fn done(&self) -> bool {
        self.nils == self.invokes.len() && self.reports.iter().all(Option::is_some)
    }

    /// Copy the stream to our stdout and stderr until every stage ended, or one failed.
    fn stream_to_end(&mut self, client: &mut Client) -> Result<(), Fail> {
        self.get = Some(self.send_get(client, true)?);
        while !self.done() {
            let (id, reply) = client.receive()?;
            if Some(id) == self.get {
                self.get = None;
                match reply {
                    Ok(item) => self.output(item)?,
                    // Withdrawn after a failure: nothing more came.
                    Err(e) if remote(&e).kind == "Empty" => {}
                    Err(e) => {
                        let message = format!("the output stream failed: {}", describe(&e));
                        self.fail(client, Fail::new(message, EXIT_FAILED))?;
                    }
                }
                if self.failed.is_some() {
                    break;
                }
                if self.nils < self.invokes.len() {
                    self.get = Some(self.send_get(client, true)?);
                }
            } else if let Some(stage) = self.invokes.iter().position(|&i| i == id) {
                match reply {
                    Ok(report) if field(&report, "ok").and_then(Value::as_bool) == Some(true) => {
                        self.reports[stage] = Some(report);
                    }
                    Ok(report) => {
                        self.reports[stage] = Some(Value::Nil);
                        self.fail(client, report_failed(&report))?;
                    }
                    Err(error) => {
                        self.reports[stage] = Some(Value::Nil);
                        self.fail(client, invocation_failed(&error))?;
                    }
                }
                if self.failed.is_some() && self.get.is_none() {
                    break;
                }
            } else if self.creates.contains(&id) {
                if let Err(e) = reply {
                    return Err(Fail::new(
                        format!("cannot create the output stream: {}", describe(&e)),
                        EXIT_FAILED,
                    ));
                }
            }
            // Anything else: replies to deletes and withdraws.
        }
        if self.failed.is_some() {
            self.drain(client)?;
        }
        Ok(())
    }

    /// Record the first failure: the pipes go (so the other stages' readers and writers get
    /// `NotFound` and end), and the parked `get` is withdrawn.
    fn fail(&mut self, client: &mut Client, failure: Fail) -> Result<(), Fail> {
        if self.failed.is_some() {
            return Ok(());
        }
        self.failed = Some(failure);
        for pipe in &self.pipes {
            let seq = client.call_seq();
            client.send("delete", vec![seq, pipe.as_str().into()])?;
        }
        if let Some(get) = self.get {
            client.send("withdraw", vec![get.into(), self.stream.as_str().into()])?;
        }
        Ok(())
    }

    /// After a failure: print what the stream still holds, without waiting for more.
    fn drain(&mut self, client: &mut Client) -> Result<(), Fail> {
        // The withdrawn get's reply, if it has not come yet.
        while let Some(get) = self.get {
            let (id, reply) = client.receive()?;
            if id == get {
                self.get = None;
                if let Ok(item) = reply {
                    self.output(item)?;
                }
            }
        }
        while self.nils < self.invokes.len() {
            let get = self.send_get(client, false)?;
            let item = loop {
                let (id, reply) = client.receive()?;
                if id == get {
                    break reply;
                }
            };
            match item {
                Ok(item) => self.output(item)?,
                Err(_) => break, // Empty: drained
            }
        }
        Ok(())
    }

    /// A `get` on the stream (`seq` 0: its reply, up to 64 KiB, is not kept for resends).
    fn send_get(&self, client: &mut Client, block: bool) -> Result<u64, Fail> {
        let operands = vec![
            0.into(),
            0.into(),
            "Queue".into(),
            self.stream.as_str().into(),
            "get".into(),
            Value::Array(vec![block.into()]),
        ];
        Ok(client.send("call", operands)?)
    }

    /// One stream item: `[fd, bytes]` to our own fd in one write, or nil (a stage ended).
    fn output(&mut self, item: Value) -> Result<(), Fail> {
        match item {
            Value::Nil => self.nils += 1,
            Value::Array(parts) => match parts.as_slice() {
                [fd, Value::Binary(bytes)] if matches!(fd.as_u64(), Some(1 | 2)) => {
                    let fd = fd.as_u64().unwrap_or(1) as libc::c_int;
                    write_all(fd, bytes)
                        .map_err(|e| Fail::new(format!("cannot write the output: {e}"), EXIT_FAILED))?;
                }
                _ => return Err(Fail::new("a malformed item in the output stream", EXIT_FAILED)),
            },
            _ => return Err(Fail::new("a malformed item in the output stream", EXIT_FAILED)),
        }
        Ok(())
    }
}

/// `write(2)` until all of `bytes` went (one call, unless the reader takes less).
fn write_all(fd: libc::c_int, mut bytes: &[u8]) -> std::io::Result<()> {
    while !bytes.is_empty() {
        // SAFETY: the pointer and length describe `bytes`, alive for the call.
        let n = unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        bytes = &bytes[n as usize..];
    }
    Ok(())
}

/// `--stdin`: a queue in the pipe encoding fed from our stdin by a thread on its own
/// connection (chunks cut as `pipe write` cuts them; blocking puts: the command's reading
/// paces ours). Returns its key.
fn forward_stdin(address: &str) -> Result<String, Fail> {
    let mut feeder = Client::connect(address)?;
    let key = feeder.unnamed_key(1);
    feeder.create("Queue", &key, vec![PIPE_ITEMS.into()], true, false)?;
    let queue = key.clone();
    std::thread::spawn(move || {
        // Unbuffered fd 0: `stdin_ready` polls it, so no bytes may wait in a buffer above it.
        // SAFETY: fd 0 stays open for the process's life; ManuallyDrop never closes it.
        let stdin = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(0) });
        let mut chunks = Chunks::new(&*stdin, stdin_ready);
        loop {
            // A read error ends the input as its end would.
            let item = chunks.next_chunk().ok().flatten().map_or(Value::Nil, Value::Binary);
            let end = item.is_nil();
            // NotFound: the command stopped reading (or ended); so do we.
            if feeder.call_waiting("Queue", &queue, "put", vec![item], None).is_err() || end {
                return;
            }
        }
    });
    Ok(key)
}

/// The error of a failed invocation (`[kind, message, data]`), with its exit status:
/// 124 for a timeout, 128 + N for a worker killed by signal N, else 255.
fn invocation_failed(error: &Value) -> Fail {
    let code = match remote(error).kind.as_str() {
        "FunctionTimeout" => EXIT_TIMEOUT,
        "WorkerCrashed" => error
            .as_array()
            .and_then(|parts| parts.get(2))
            .and_then(|data| field(data, "signal"))
            .and_then(Value::as_u64)
            .and_then(|signal| u8::try_from(128 + signal).ok())
            .unwrap_or(EXIT_FAILED),
        _ => EXIT_FAILED,
    };
    Fail::new(describe(error), code)
}

/// A report with `ok` false: the command could not run.
fn report_failed(report: &Value) -> Fail {
    let error = field(report, "error");
    let text = |name: &str| {
        error
            .and_then(|e| field(e, name))
            .and_then(Value::as_str)
            .unwrap_or("?")
    };
    Fail::new(format!("{}: {}", text("type"), text("message")), EXIT_FAILED)
}

/// `KIND: message` of an error reply.
fn describe(error: &Value) -> String {
    let remote = remote(error);
    format!("{}: {}", remote.kind, remote.message)
}

/// A random UUID (version 4) naming this run.
fn request_id() -> String {
    let mut b = random_bytes();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// Split a command line at its top-level `|`s, as bash would parse it: not inside quotes,
/// `$(...)`, backquotes, `${...}`, `( ... )` or `{ ...; }`, nor escaped, nor in a comment.
/// `||` and `|&` are refused (they are not plain pipes between stages).
pub(crate) fn split_pipeline(line: &str) -> Result<Vec<String>, String> {
    let chars: Vec<char> = line.chars().collect();
    let mut stages = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '|' => {
                match chars.get(i + 1) {
                    Some('|') => {
                        return Err(
                            "`||` is not a pipe: --pipe splits `A | B` only (run the whole line in one function: drop --pipe)".into(),
                        )
                    }
                    Some('&') => {
                        return Err("`|&` is not supported with --pipe: write `A 2>&1 | B`".into());
                    }
                    _ => {}
                }
                stages.push(chars[start..i].iter().collect::<String>());
                start = i + 1;
                i += 1;
            }
            _ => i = skip(&chars, i, true)?,
        }
    }
    stages.push(chars[start..].iter().collect::<String>());
    let stages: Vec<String> = stages.into_iter().map(|s| s.trim().to_string()).collect();
    if stages.iter().any(String::is_empty) {
        return Err("an empty stage in the pipe (a `|` with nothing on one side)".into());
    }
    Ok(stages)
}

/// Whether position `i` starts a word (for `#`, `{` and `}`).
fn word_start(chars: &[char], i: usize) -> bool {
    i == 0 || matches!(chars[i - 1], ' ' | '\t' | '\n' | ';' | '&' | '|' | '(' | ')')
}

/// The index after the construct starting at `i` (one plain character, or a whole quoted
/// or nested construct). `top`: a `}` or `)` here is unbalanced.
fn skip(chars: &[char], i: usize, top: bool) -> Result<usize, String> {
    let at = |j: usize| chars.get(j).copied();
    match chars[i] {
        '\\' => Ok((i + 2).min(chars.len())),
        '\'' => {
            let end = (i + 1..chars.len())
                .find(|&j| chars[j] == '\'')
                .ok_or("an unterminated ' quote")?;
            Ok(end + 1)
        }
        '"' => {
            let mut j = i + 1;
            loop {
                match at(j) {
                    None => return Err("an unterminated \" quote".into()),
                    Some('"') => return Ok(j + 1),
                    Some('\\') => j += 2,
                    Some('$') | Some('`') => j = skip(chars, j, false)?,
                    Some(_) => j += 1,
                }
            }
        }
        '`' => {
            let mut j = i + 1;
            loop {
                match at(j) {
                    None => return Err("an unterminated ` quote".into()),
                    Some('`') => return Ok(j + 1),
                    Some('\\') => j += 2,
                    Some(_) => j += 1,
                }
            }
        }
        '$' if at(i + 1) == Some('(') => nested(chars, i + 2, ')'),
        '$' if at(i + 1) == Some('{') => nested(chars, i + 2, '}'),
        '(' => nested(chars, i + 1, ')'),
        '{' if word_start(chars, i) && at(i + 1).is_none_or(char::is_whitespace) => nested(chars, i + 1, '}'),
        '#' if word_start(chars, i) => Ok((i..chars.len()).find(|&j| chars[j] == '\n').unwrap_or(chars.len())),
        ')' if top => Err("an unbalanced `)`".into()),
        _ => Ok(i + 1),
    }
}

/// The index after the `close` that ends a construct whose body starts at `i`.
fn nested(chars: &[char], mut i: usize, close: char) -> Result<usize, String> {
    while i < chars.len() {
        if chars[i] == close {
            return Ok(i + 1);
        }
        i = skip(chars, i, false)?;
    }
    Err(format!("an unterminated construct: no closing `{close}`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(line: &str) -> Vec<String> {
        split_pipeline(line).unwrap_or_else(|e| panic!("{line}: {e}"))
    }

    #[test]
    fn stages_split_at_top_level_bars() {
        assert_eq!(
            split("seq 1 100000 | grep 7 | wc -l"),
            ["seq 1 100000", "grep 7", "wc -l"]
        );
        assert_eq!(split("cat"), ["cat"]);
        assert_eq!(split("a|b"), ["a", "b"]);
        assert_eq!(split(" a 2>&1 |  b > out "), ["a 2>&1", "b > out"]);
    }

    #[test]
    fn quoted_and_escaped_bars_stay() {
        assert_eq!(split("echo 'a|b' | tr '|' x"), ["echo 'a|b'", "tr '|' x"]);
        assert_eq!(split(r#"echo "a | b" | cat"#), [r#"echo "a | b""#, "cat"]);
        assert_eq!(split(r"echo a\|b | cat"), [r"echo a\|b", "cat"]);
        assert_eq!(split(r#"echo "x\"|y" | cat"#), [r#"echo "x\"|y""#, "cat"]);
        assert_eq!(split("echo \"it's | here\" | cat"), ["echo \"it's | here\"", "cat"]);
    }

    #[test]
    fn nested_constructs_keep_their_bars() {
        assert_eq!(split("echo $(ls | wc -l) | cat"), ["echo $(ls | wc -l)", "cat"]);
        assert_eq!(split("echo `ls | wc -l` | cat"), ["echo `ls | wc -l`", "cat"]);
        assert_eq!(split("(a | b) | c"), ["(a | b)", "c"]);
        assert_eq!(split("{ a | b; } | c"), ["{ a | b; }", "c"]);
        assert_eq!(split("echo ${x:-a|b} | c"), ["echo ${x:-a|b}", "c"]);
        assert_eq!(split("echo \"$(echo \")|\")\" | c"), ["echo \"$(echo \")|\")\"", "c"]);
        assert_eq!(split("echo $((1 | 2)) | c"), ["echo $((1 | 2))", "c"]);
        assert_eq!(split("echo a{b,c} | c"), ["echo a{b,c}", "c"]);
    }

    #[test]
    fn comments_hide_bars() {
        assert_eq!(split("echo a # | not a stage"), ["echo a # | not a stage"]);
        assert_eq!(split("echo a#b | cat"), ["echo a#b", "cat"]);
    }

    #[test]
    fn bad_pipelines_are_refused_clearly() {
        let err = |line: &str| split_pipeline(line).unwrap_err();
        assert!(err("a || b").contains("`||`"));
        assert!(err("a |& b").contains("`|&`"));
        assert!(err("a | | b").contains("empty stage"));
        assert!(err("| a").contains("empty stage"));
        assert!(err("a |").contains("empty stage"));
        assert!(err("echo 'a | b").contains("unterminated '"));
        assert!(err("echo \"a | b").contains("unterminated \""));
        assert!(err("echo $(a | b").contains("unterminated"));
        assert!(err("a ) | b").contains("unbalanced"));
    }

    #[test]
    fn request_ids_are_uuids() {
        let id = request_id();
        assert_eq!(id.len(), 36);
        assert_eq!(id.as_bytes()[14], b'4');
        assert_ne!(id, request_id());
    }
}
