//! Shared objects as shell commands, with the syntax of CRUCIAL's serverless shell:
//! `TYPE -n NAME OPERATION [-1 VALUE] [-2 VALUE]`, as in `counter -n hits increment -i 5`.
//!
//! The `spindle` binary runs them when it is started under a type's name (a symlink called
//! `counter`, or a function from `spindle shell-env`) or as `spindle counter ...`. Each is a
//! native process that connects, makes a call or two and exits: a few milliseconds, so a
//! script can run thousands of them.
//!
//! One file per family, like mini-redis' `cmd/`: [`args`] reads the command line,
//! [`output`] prints values the way a shell reads them, [`object`] makes the calls, and
//! [`counter`], [`collections`] (map, treemap, list), [`sync`] (barrier, rdv, semaphore,
//! latch) and [`streams`] (queue, pipe, blob) say what each operation does.

mod args;
mod collections;
mod counter;
mod object;
mod output;
pub(crate) mod streams;
mod sync;

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::ExitCode;

use crate::client::Client;

pub(crate) use args::Invocation;
pub(crate) use object::Object;
pub(crate) use output::Out;

/// What went wrong, and so the exit status: 2 for a usage error, 1 for a runtime error,
/// or a status without a message (a missing map key is 1, a closed stdout 141).
#[derive(Debug)]
pub(crate) enum Exit {
    Usage(String),
    Error(String),
    Silent(u8),
}

pub(crate) type Outcome = Result<(), Exit>;

/// One object command: its operations, flags and help, and what running it does.
pub(crate) struct Spec {
    /// The command's name (`counter`).
    pub name: &'static str,
    /// The Spindle type behind it (`Counter`).
    pub spindle: &'static str,
    /// One line for the help's first line.
    pub about: &'static str,
    /// Operations, in help order (empty for `rdv`, which has none).
    pub ops: &'static [Op],
    /// Flags beside `-n`.
    pub flags: &'static [args::Flag],
    /// Extra help: examples, what is printed.
    pub notes: &'static str,
    pub run: fn(&Invocation, &mut Object, &mut Out) -> Outcome,
}

pub(crate) struct Op {
    pub name: &'static str,
    pub aliases: &'static [&'static str],
    /// Its arguments, for the help (`[-1 N | -i N]`).
    pub usage: &'static str,
    pub help: &'static str,
}

/// `TYPE -n NAME delete`, for every type but `rdv`.
pub(crate) const DELETE: Op = Op {
    name: "delete",
    aliases: &[],
    usage: "",
    help: "delete the object (parked callers get an error)",
};

const SPECS: [&Spec; 11] = [
    &counter::COUNTER,
    &collections::MAP,
    &collections::TREEMAP,
    &collections::LIST,
    &sync::BARRIER,
    &sync::RDV,
    &streams::PIPE,
    &sync::SEMAPHORE,
    &sync::LATCH,
    &streams::QUEUE,
    &streams::BLOB,
];

/// The command names, for `spindle --help` and `shell-env`.
pub(crate) fn names() -> impl Iterator<Item = &'static str> {
    SPECS.iter().map(|s| s.name)
}

fn spec(name: &str) -> Option<&'static Spec> {
    SPECS.iter().copied().find(|s| s.name == name)
}

/// Run this process as an object command if it is one: started under a type's name, or as
/// `spindle TYPE ...`. An unknown `spindle WORD` (neither a type nor one of `is_command`) is
/// a one-line usage error here too. `None`: this is an ordinary `spindle` command line.
pub(crate) fn dispatch(is_command: impl Fn(&str) -> bool) -> Option<ExitCode> {
    let mut argv = std::env::args_os();
    let argv0 = argv.next()?;
    if let Some(spec) = Path::new(&argv0).file_name().and_then(|n| n.to_str()).and_then(spec) {
        return Some(run(spec, argv.collect()));
    }
    let first = argv.next()?;
    let first = first.to_str()?;
    if let Some(spec) = spec(first) {
        return Some(run(spec, argv.collect()));
    }
    if first.starts_with('-') || first == "help" || is_command(first) {
        return None;
    }
    let types: Vec<_> = names().collect();
    let _ = writeln!(
        std::io::stderr(),
        "spindle: unknown command or object type '{first}' (object types: {}; commands: see spindle --help)",
        types.join(", ")
    );
    Some(ExitCode::from(2))
}

fn run(spec: &'static Spec, argv: Vec<OsString>) -> ExitCode {
    let argv: Vec<String> = argv.into_iter().map(|a| a.to_string_lossy().into_owned()).collect();
    let mut out = Out::new();
    let result = execute(spec, &argv, &mut out);
    let flushed = out.flush();
    let status = match result.and(flushed) {
        Ok(()) => 0,
        Err(Exit::Usage(message)) => {
            let _ = writeln!(std::io::stderr(), "{}: {message}", spec.name);
            2
        }
        Err(Exit::Error(message)) => {
            let _ = writeln!(std::io::stderr(), "{}: {message}", spec.name);
            1
        }
        Err(Exit::Silent(status)) => status,
    };
    ExitCode::from(status)
}

fn execute(spec: &'static Spec, argv: &[String], out: &mut Out) -> Outcome {
    let Some(invocation) = args::parse(spec, argv)? else {
        return out.raw(args::help(spec).as_bytes());
    };
    let address = std::env::var("SPINDLE_ADDRESS")
        .ok()
        .filter(|a| !a.trim().is_empty())
        .unwrap_or_else(|| crate::DEFAULT_ADDRESS.to_string());
    let client = Client::connect(&address).map_err(Exit::Error)?;
    let mut object = Object::new(client, spec, &invocation.name);
    if invocation.op == DELETE.name {
        return object.delete();
    }
    (spec.run)(&invocation, &mut object, out)
}

/// `spindle shell-env`: shell functions that make every object type a command, calling this
/// executable by its absolute path. `eval "$(spindle shell-env)"`; bash also exports them to
/// child shells.
pub(crate) fn shell_env() -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("cannot find this executable: {e}"))?;
    let exe = quote(exe.as_os_str().as_bytes());
    let mut script = b"# Spindle's shared objects as shell commands: eval \"$(spindle shell-env)\"\n".to_vec();
    for name in names() {
        script.extend_from_slice(format!("{name}() {{ ").as_bytes());
        script.extend_from_slice(&exe);
        script.extend_from_slice(format!(" {name} \"$@\"; }}\n").as_bytes());
    }
    let all: Vec<_> = names().collect();
    script.extend_from_slice(
        format!(
            "if [ -n \"${{BASH_VERSION:-}}\" ]; then export -f {}; fi\n",
            all.join(" ")
        )
        .as_bytes(),
    );
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(&script)
        .and_then(|()| stdout.flush())
        .map_err(|e| format!("cannot write to stdout: {e}"))
}

/// `bytes` as one single-quoted shell word.
fn quote(bytes: &[u8]) -> Vec<u8> {
    let mut quoted = vec![b'\''];
    for &b in bytes {
        if b == b'\'' {
            quoted.extend_from_slice(b"'\\''");
        } else {
            quoted.push(b);
        }
    }
    quoted.push(b'\'');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(
            quote(b"/opt/it's here/spindle"),
            b"'/opt/it'\\''s here/spindle'".to_vec()
        );
    }

    #[test]
    fn the_commands_are_the_ones_the_server_puts_on_path() {
        assert_eq!(names().collect::<Vec<_>>(), spindle_proto::SHELL_OBJECT_COMMANDS);
    }

    #[test]
    fn every_command_has_help_and_unique_operations() {
        for spec in SPECS {
            let help = args::help(spec);
            assert!(help.starts_with(spec.name), "{help}");
            let mut names: Vec<_> = spec
                .ops
                .iter()
                .flat_map(|o| std::iter::once(o.name).chain(o.aliases.iter().copied()))
                .collect();
            let n = names.len();
            names.sort_unstable();
            names.dedup();
            assert_eq!(names.len(), n, "{}: an operation name twice", spec.name);
        }
    }
}
