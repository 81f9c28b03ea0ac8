//! Objects of compiled (`wasm:`) types: built-in objects in every way but where their code
//! comes from. The server offers a type's module before a create reaches the partition
//! ([`Partition::offer_class`]); the partition has the [`Library`] compile it once, and logs
//! the module ahead of the first persistent create of its version, so a replay, a replica
//! or a partition snapshot can compile it again.

use ahash::HashMap;
use std::sync::Arc;

use super::Partition;
use crate::objects::compiled::{self, Code, CompiledObject, Library};
use crate::{objects, Error, Object, Value};

/// The compiled code of each `(type, version)` this partition has seen.
pub(super) type Codes = HashMap<(String, String), Arc<dyn Code>>;

/// A new object of `type_name`, built-in or compiled, from its `create` arguments.
pub(super) fn create_object(codes: &Codes, type_name: &str, args: Vec<Value>) -> Result<Box<dyn Object>, Error> {
    if !compiled::is_compiled_type(type_name) {
        return objects::create(type_name, &args);
    }
    let (version, args) = compiled::parse_create_args(type_name, args)?;
    let code = codes
        .get(&(type_name.to_string(), version.clone()))
        .ok_or_else(|| compiled::not_defined(type_name, &version))?;
    Ok(Box::new(CompiledObject::new(type_name, &version, code.clone(), &args)?))
}

impl Partition {
    /// Where the code of compiled types is compiled: the server's runtime. Without one, a
    /// partition refuses compiled types.
    pub fn set_library(&mut self, library: Arc<dyn Library>) {
        self.library = Some(library);
    }

    /// Have the code of compiled type `type_name` at `version` compiled, if it is not yet.
    pub(super) fn compile(&mut self, type_name: &str, version: &str, code: &[u8]) -> Result<(), Error> {
        let class = (type_name.to_string(), version.to_string());
        if self.codes.contains_key(&class) {
            return Ok(());
        }
        let library = self
            .library
            .as_ref()
            .ok_or_else(|| compiled::not_defined(type_name, version))?;
        let compiled = library.load(type_name, version, code)?;
        self.codes.insert(class, compiled);
        Ok(())
    }

    /// `version` of `type_name` was defined anew: the type's other versions that no object
    /// here uses go (a create names the defined version; a redefined type's old code would
    /// otherwise stay for ever). Not while replaying or restoring, which bring the versions
    /// back before the objects that use them.
    pub(super) fn forget_unused_code(&mut self, type_name: &str, version: &str) {
        self.codes
            .retain(|(t, v), code| t != type_name || v == version || Arc::strong_count(code) > 1);
    }

    /// Rebuild a compiled object from its snapshot (the code of its version was restored or
    /// replayed before it).
    pub(super) fn restore_compiled(&self, type_name: &str, state: &Value) -> Result<Box<dyn Object>, Error> {
        let version = CompiledObject::snapshot_version(state)?;
        let code = self
            .codes
            .get(&(type_name.to_string(), version.clone()))
            .ok_or_else(|| compiled::not_defined(type_name, &version))?;
        Ok(Box::new(CompiledObject::restore(type_name, code.clone(), state)?))
    }
}
