//! The command line of an object command, read the way CRUCIAL's shell reads it: `-n NAME`,
//! one operation word, and options in any order around it. `-1 VALUE` is the operation's
//! first argument and `-2 VALUE` its second (a repeated `-1` makes a list); `-i`, `-p`, `-t`
//! are the friendly names of an increment, a count of parties and a timeout.
//!
//! Hand-written rather than clap: every mistake must be one line on stderr with status 2, an
//! option value may look like a negative number (`-1 -5`), and the help is built from the
//! same tables that drive the commands.

use spindle_core::Value;

use super::{Exit, Spec};

/// Where an option's value goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Slot {
    One,
    Two,
    Three,
    Increment,
    Parties,
    Timeout,
    Initial,
}

/// An option beside `-n`. A flag with an empty `help` is accepted but not shown.
pub(crate) struct Flag {
    pub slot: Slot,
    pub short: &'static str,
    pub long: &'static str,
    pub value: &'static str,
    pub help: &'static str,
}

pub(crate) const fn flag(slot: Slot, short: &'static str, value: &'static str, help: &'static str) -> Flag {
    Flag {
        slot,
        short,
        long: "",
        value,
        help,
    }
}

pub(crate) const fn long_flag(
    slot: Slot,
    short: &'static str,
    long: &'static str,
    value: &'static str,
    help: &'static str,
) -> Flag {
    Flag {
        slot,
        short,
        long,
        value,
        help,
    }
}

/// A parsed command line.
#[derive(Debug, Default)]
pub(crate) struct Invocation {
    pub name: String,
    /// The operation's canonical name ("" for `rdv`, which has none).
    pub op: &'static str,
    one: Vec<String>,
    two: Vec<String>,
    three: Vec<String>,
    increment: Vec<String>,
    parties: Vec<String>,
    timeout: Vec<String>,
    initial: Vec<String>,
}

fn usage(message: impl Into<String>) -> Exit {
    Exit::Usage(message.into())
}

impl Invocation {
    fn slot(&self, slot: Slot) -> &Vec<String> {
        match slot {
            Slot::One => &self.one,
            Slot::Two => &self.two,
            Slot::Three => &self.three,
            Slot::Increment => &self.increment,
            Slot::Parties => &self.parties,
            Slot::Timeout => &self.timeout,
            Slot::Initial => &self.initial,
        }
    }

    fn slot_mut(&mut self, slot: Slot) -> &mut Vec<String> {
        match slot {
            Slot::One => &mut self.one,
            Slot::Two => &mut self.two,
            Slot::Three => &mut self.three,
            Slot::Increment => &mut self.increment,
            Slot::Parties => &mut self.parties,
            Slot::Timeout => &mut self.timeout,
            Slot::Initial => &mut self.initial,
        }
    }

    /// Every value given for `slot`, in order.
    pub fn values(&self, slot: Slot) -> &[String] {
        self.slot(slot)
    }

    /// The value of `slot` if given, at most once.
    pub fn optional(&self, slot: Slot, flag: &str) -> Result<Option<&str>, Exit> {
        match self.slot(slot).as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one)),
            _ => Err(usage(format!("{} takes one {flag}", self.what()))),
        }
    }

    /// The one value of `slot`, which the operation needs (`flag` says which, for the message:
    /// `-1 KEY`).
    pub fn single(&self, slot: Slot, flag: &str) -> Result<&str, Exit> {
        self.optional(slot, flag)?
            .ok_or_else(|| usage(format!("{} needs {flag}", self.what())))
    }

    /// `-t SECONDS`: a non-negative number of seconds.
    pub fn timeout(&self) -> Result<Option<f64>, Exit> {
        let Some(text) = self.optional(Slot::Timeout, "-t SECONDS")? else {
            return Ok(None);
        };
        match text.trim().parse::<f64>() {
            Ok(t) if t.is_finite() && t >= 0.0 => Ok(Some(t)),
            _ => Err(usage(format!(
                "-t needs a non-negative number of seconds, got '{text}'"
            ))),
        }
    }

    /// `-p N`, at least `min`.
    pub fn parties(&self, what: &str, min: i64) -> Result<Option<i64>, Exit> {
        let Some(text) = self.optional(Slot::Parties, "-p")? else {
            return Ok(None);
        };
        match integer(text) {
            Some(n) if n >= min => Ok(Some(n)),
            _ => Err(usage(format!("-p needs {what} (an integer >= {min}), got '{text}'"))),
        }
    }

    /// The operation, for messages: `increment`, or the command for `rdv`.
    fn what(&self) -> &str {
        if self.op.is_empty() {
            "rdv"
        } else {
            self.op
        }
    }
}

/// `text` as an integer argument, or a usage error naming `what`.
pub(crate) fn int_arg(text: &str, what: &str) -> Result<i64, Exit> {
    integer(text).ok_or_else(|| usage(format!("{what} must be an integer, got '{text}'")))
}

fn integer(text: &str) -> Option<i64> {
    match typed(text) {
        Value::Integer(n) => n.as_i64(),
        _ => None,
    }
}

/// A value typed at the shell: an integer or float literal is a number, anything else a
/// string (so `map get -1 1` finds the key `mergeAll -1 "1=1"` wrote, and Python reads an
/// int). Integers past 64 bits, `inf` and `nan` stay strings.
pub(crate) fn typed(text: &str) -> Value {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let unsigned = text.strip_prefix(['+', '-']).unwrap_or(text);
    if digits(unsigned) {
        if let Ok(n) = text.parse::<i64>() {
            return Value::from(n);
        }
        if let Ok(n) = text.parse::<u64>() {
            return Value::from(n);
        }
        return Value::from(text);
    }
    // A float literal: digits with a point and/or an exponent, nothing else.
    let (mantissa, exponent) = match unsigned.find(['e', 'E']) {
        Some(i) => (&unsigned[..i], Some(&unsigned[i + 1..])),
        None => (unsigned, None),
    };
    let mantissa_ok = match mantissa.split_once('.') {
        Some((whole, fraction)) => {
            (whole.is_empty() || digits(whole))
                && (fraction.is_empty() || digits(fraction))
                && !(whole.is_empty() && fraction.is_empty())
        }
        None => digits(mantissa),
    };
    let exponent_ok = match exponent {
        Some(e) => digits(e.strip_prefix(['+', '-']).unwrap_or(e)),
        None => true,
    };
    if mantissa_ok && exponent_ok && (mantissa.contains('.') || exponent.is_some()) {
        if let Ok(x) = text.parse::<f64>() {
            if x.is_finite() {
                return Value::F64(x);
            }
        }
    }
    Value::from(text)
}

/// Read `argv` (after the command's name) for `spec`. `None`: help was asked for.
pub(crate) fn parse(spec: &'static Spec, argv: &[String]) -> Result<Option<Invocation>, Exit> {
    let mut inv = Invocation::default();
    let mut name = None;
    let mut positionals = Vec::new();
    let mut rest = argv.iter();
    while let Some(arg) = rest.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        if arg == "--" {
            positionals.extend(rest.by_ref().cloned());
            break;
        }
        if !arg.starts_with('-') || arg.len() < 2 {
            positionals.push(arg.clone());
            continue;
        }
        // `--name NAME`, `--name=NAME`, `-n NAME` or `-nNAME`.
        let (flag, attached) = match arg.strip_prefix("--") {
            Some(long) => match long.split_once('=') {
                Some((f, v)) => (format!("--{f}"), Some(v.to_string())),
                None => (arg.clone(), None),
            },
            None => {
                let end = arg.char_indices().nth(2).map_or(arg.len(), |(i, _)| i);
                (
                    arg[..end].to_string(),
                    (end < arg.len()).then(|| arg[end..].to_string()),
                )
            }
        };
        let slot = if flag == "-n" || flag == "--name" {
            None
        } else {
            let known = spec
                .flags
                .iter()
                .find(|f| f.short == flag || (!f.long.is_empty() && f.long == flag));
            match known {
                Some(f) => Some(f.slot),
                None => return Err(usage(format!("unknown option '{flag}' (see {} --help)", spec.name))),
            }
        };
        let value = match attached {
            Some(v) => v,
            None => rest
                .next()
                .cloned()
                .ok_or_else(|| usage(format!("{flag} needs a value")))?,
        };
        match slot {
            None => name = Some(value),
            Some(slot) => inv.slot_mut(slot).push(value),
        }
    }
    let mut positionals = positionals.into_iter();
    if spec.ops.is_empty() {
        // `rdv NAME [-1 VALUE]`, as CRUCIAL's rewritten pipes call it, or `rdv -n NAME`.
        if name.is_none() {
            name = positionals.next();
        }
    } else {
        let operations = || spec.ops.iter().map(|o| o.name).collect::<Vec<_>>().join(", ");
        let word = positionals
            .next()
            .ok_or_else(|| usage(format!("missing operation (operations: {})", operations())))?;
        inv.op = spec
            .ops
            .iter()
            .find(|o| o.name == word || o.aliases.contains(&word.as_str()))
            .map(|o| o.name)
            .ok_or_else(|| usage(format!("unknown operation '{word}' (operations: {})", operations())))?;
    }
    if let Some(extra) = positionals.next() {
        return Err(usage(format!(
            "unexpected argument '{extra}' (see {} --help)",
            spec.name
        )));
    }
    inv.name = match name {
        Some(n) if n.is_empty() => return Err(usage("the name after -n must not be empty")),
        Some(n) => n,
        None if spec.ops.is_empty() => return Err(usage("missing the name: rdv NAME [-1 VALUE], or rdv -n NAME")),
        None => return Err(usage("missing -n NAME (the object's name)")),
    };
    Ok(Some(inv))
}

/// `TYPE --help`.
pub(crate) fn help(spec: &Spec) -> String {
    let mut text = format!("{}: {} (Spindle's {})\n\n", spec.name, spec.about, spec.spindle);
    if spec.ops.is_empty() {
        text += &format!("Usage: {0} -n NAME [OPTIONS]   (or {0} NAME [OPTIONS])\n", spec.name);
    } else {
        text += &format!("Usage: {} -n NAME OPERATION [OPTIONS]\n\nOperations:\n", spec.name);
        let rows: Vec<(String, &str)> = spec
            .ops
            .iter()
            .map(|op| {
                let mut head = op.name.to_string();
                for alias in op.aliases {
                    head += &format!(" | {alias}");
                }
                if !op.usage.is_empty() {
                    head += &format!(" {}", op.usage);
                }
                (head, op.help)
            })
            .collect();
        let width = rows.iter().map(|(h, _)| h.len()).max().unwrap_or(0);
        for (head, help) in rows {
            text += &format!("  {head:<width$}  {help}\n");
        }
    }
    text += "\nOptions:\n";
    let mut rows = vec![(
        "-n, --name NAME".to_string(),
        "the object's name: created on first use, the same object for every program",
    )];
    for f in spec.flags.iter().filter(|f| !f.help.is_empty()) {
        let names = if f.long.is_empty() {
            f.short.to_string()
        } else {
            format!("{}, {}", f.short, f.long)
        };
        rows.push((format!("{names} {}", f.value), f.help));
    }
    rows.push(("-h, --help".to_string(), "print this help"));
    let width = rows.iter().map(|(h, _)| h.len()).max().unwrap_or(0);
    for (head, help) in rows {
        text += &format!("  {head:<width$}  {help}\n");
    }
    if !spec.notes.is_empty() {
        text += &format!("\n{}\n", spec.notes.trim_end());
    }
    text += "\nValues typed here are numbers when they read as an integer or a float, strings otherwise.\n\
             Server: $SPINDLE_ADDRESS (default 127.0.0.1:7070; a comma-separated list: the first that\n\
             answers) and $SPINDLE_TOKEN.\n\
             Exit status: 0 success, 1 runtime error (timeout, missing value, server unreachable), 2 usage\n\
             error.\n";
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_values_are_typed_like_literals() {
        assert_eq!(typed("1"), Value::from(1));
        assert_eq!(typed("-42"), Value::from(-42));
        assert_eq!(typed("+7"), Value::from(7));
        assert_eq!(typed("18446744073709551615"), Value::from(u64::MAX));
        assert_eq!(
            typed("123456789012345678901234"),
            Value::from("123456789012345678901234")
        );
        assert_eq!(typed("1.5"), Value::F64(1.5));
        assert_eq!(typed("-.5"), Value::F64(-0.5));
        assert_eq!(typed("2."), Value::F64(2.0));
        assert_eq!(typed("1e3"), Value::F64(1000.0));
        assert_eq!(typed("1.5E-2"), Value::F64(0.015));
        for text in [
            "", "-", ".", "abc", "1a", "1.2.3", "10.0.0.1", "inf", "nan", "1e", "e5", " 1", "1_000", "0x10", "1e999",
        ] {
            assert_eq!(typed(text), Value::from(text), "{text:?}");
        }
    }
}
