//! The ABI (version 1) a module keeps to be a compiled object type, checked once when it is
//! loaded so that a call never meets a surprise (docs/wasm.md has the guest's side).
//!
//! Exports:
//!
//! ```text
//! memory                                  memory 0; arguments, state and replies pass through it
//! spindle_alloc(len: i32) -> i32          len writable bytes for the call's arguments
//! init(args_ptr: i32, args_len: i32)      optional constructor
//! <method>(args_ptr: i32, args_len: i32)  every other exported function, except names that
//!                                         start with `_` or `spindle_`
//! ```
//!
//! Imports, all from module `spindle` and all optional: [`IMPORTS`]. Anything else (WASI,
//! `env.*`, a clock, randomness) is refused, which is what keeps a method deterministic: the
//! only things it can observe are its state, its arguments and the replies of the calls it
//! makes to other objects (`call`, then `result_read`), which the server hands back the same
//! in every run of the method.

use std::fmt::Write as _;

use spindle_core::Error;
use wasmtime::{ExternType, FuncType, Module, ModuleExport, ValType};

/// Every function the host offers: name, number of `i32` parameters, number of `i32` results.
pub const IMPORTS: &[(&str, usize, usize)] = &[
    ("state_len", 0, 1),
    ("state_read", 1, 0),
    ("state_write", 2, 0),
    ("reply", 2, 0),
    ("fail", 4, 0),
    ("call", 6, 1),
    ("result_read", 1, 0),
];

/// The module that every import must come from.
pub const IMPORT_MODULE: &str = "spindle";

/// Where a checked module keeps the exports the host calls.
pub(crate) struct Exports {
    pub memory: ModuleExport,
    pub alloc: ModuleExport,
    pub init: Option<ModuleExport>,
    /// Sorted by name.
    pub methods: Vec<(String, ModuleExport)>,
    /// It imports `spindle.call`: its methods may call other objects.
    pub makes_calls: bool,
}

/// Check `module` against the ABI; `type_name` and `memory_limit` are for the messages.
pub(crate) fn check(type_name: &str, module: &Module, memory_limit: usize) -> Result<Exports, Error> {
    let refuse = |what: String| Error::bad_args(format!("{type_name} cannot be loaded: {what}"));

    let mut makes_calls = false;
    for import in module.imports() {
        let (module_name, name) = (import.module(), import.name());
        makes_calls |= module_name == IMPORT_MODULE && name == "call";
        let wanted = IMPORTS
            .iter()
            .find(|(n, _, _)| module_name == IMPORT_MODULE && *n == name);
        let Some(&(_, params, results)) = wanted else {
            return Err(refuse(format!(
                "import `{module_name}.{name}` not allowed: only {IMPORT_MODULE}.* imports listed in the ABI ({}) \
                 (a compiled method sees only its state and arguments, so that every replica computes the same)",
                IMPORTS.iter().map(|(n, _, _)| *n).collect::<Vec<_>>().join(", ")
            )));
        };
        match import.ty() {
            ExternType::Func(ty) if is_i32s(&ty, params, results) => {}
            ExternType::Func(ty) => {
                return Err(refuse(format!(
                    "import `{module_name}.{name}` has signature {}, expected {}",
                    signature(&ty),
                    i32_signature(params, results)
                )))
            }
            _ => return Err(refuse(format!("import `{module_name}.{name}` must be a function"))),
        }
    }

    let mut memory = None;
    let mut alloc = None;
    let mut init = None;
    let mut methods = Vec::new();
    for export in module.exports() {
        let name = export.name();
        let index = || module.get_export_index(name).expect("an export of this module");
        match (name, export.ty()) {
            ("memory", ExternType::Memory(ty)) => memory = Some((ty, index())),
            ("memory", _) => return Err(refuse("export `memory` is not a memory".into())),
            ("spindle_alloc", ExternType::Func(ty)) => {
                if !is_i32s(&ty, 1, 1) {
                    return Err(refuse(format!(
                        "export `spindle_alloc` has signature {}, expected (i32) -> i32",
                        signature(&ty)
                    )));
                }
                alloc = Some(index());
            }
            (_, ExternType::Func(ty)) if !is_reserved(name) => {
                if !is_i32s(&ty, 2, 0) {
                    let what = if name == "init" { "constructor" } else { "method" };
                    return Err(refuse(format!(
                        "{what} `{name}` has signature {}, expected (i32, i32) -> () (a pointer to and length of its \
                         MessagePack arguments)",
                        signature(&ty)
                    )));
                }
                if name == "init" {
                    init = Some(index());
                } else {
                    methods.push((name.to_string(), index()));
                }
            }
            _ => {} // globals, tables and reserved names are the toolchain's business
        }
    }

    let Some((memory, memory_export)) = memory else {
        return Err(refuse(
            "missing export `memory` (the guest's memory 0, where arguments and state pass)".into(),
        ));
    };
    let Some(alloc) = alloc else {
        return Err(refuse(
            "missing export `spindle_alloc` ((i32) -> i32: where the host writes a call's arguments)".into(),
        ));
    };
    if memory.is_shared() || memory.is_64() {
        return Err(refuse(
            "export `memory` must be a plain 32-bit memory (not shared, not 64-bit)".into(),
        ));
    }
    let initial = memory.minimum().saturating_mul(memory.page_size());
    if initial > memory_limit as u64 {
        return Err(refuse(format!(
            "export `memory` starts at {initial} bytes, over the limit of {memory_limit} bytes per instance"
        )));
    }
    if methods.is_empty() {
        return Err(refuse(
            "no methods: export at least one function of type (i32, i32) -> () whose name does not start with `_` \
             or `spindle_` and is not `init`"
                .into(),
        ));
    }
    methods.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Exports {
        memory: memory_export,
        alloc,
        init,
        methods,
        makes_calls,
    })
}

/// Names that are never methods: the toolchain's (`_start`, `__new`, ...) and the ABI's own.
fn is_reserved(name: &str) -> bool {
    name.starts_with('_') || name.starts_with("spindle_")
}

fn is_i32s(ty: &FuncType, params: usize, results: usize) -> bool {
    ty.params().len() == params
        && ty.results().len() == results
        && ty.params().chain(ty.results()).all(|t| matches!(t, ValType::I32))
}

fn signature(ty: &FuncType) -> String {
    let list = |types: &mut dyn Iterator<Item = ValType>| {
        let mut out = String::new();
        for (i, t) in types.enumerate() {
            let _ = write!(out, "{}{t}", if i > 0 { ", " } else { "" });
        }
        out
    };
    let results: Vec<ValType> = ty.results().collect();
    let results = match results.len() {
        1 => results[0].to_string(),
        _ => format!("({})", list(&mut results.into_iter())),
    };
    format!("({}) -> {results}", list(&mut ty.params()))
}

fn i32_signature(params: usize, results: usize) -> String {
    let params = vec!["i32"; params].join(", ");
    let results = match results {
        1 => "i32".to_string(),
        n => format!("({})", vec!["i32"; n].join(", ")),
    };
    format!("({params}) -> {results}")
}
