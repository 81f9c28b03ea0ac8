//! The named object a command works on: created on first use, then called.

use std::time::Duration;

use spindle_core::Value;

use super::{Exit, Outcome, Spec};
use crate::client::{Client, Failure};

pub(crate) struct Object {
    client: Client,
    spec: &'static Spec,
    pub key: String,
    /// Why `create` was refused with a `ValueError`, if it was: a persistent object of that
    /// name refuses an ephemeral `create` but answers calls, so this is only reported when
    /// the call then finds no object (a bad constructor argument, like `-p -1`).
    refused: Option<String>,
}

impl Object {
    pub fn new(client: Client, spec: &'static Spec, key: &str) -> Object {
        Object {
            client,
            spec,
            key: key.to_string(),
            refused: None,
        }
    }

    /// Create the object with the constructor arguments `args`, unless it exists (then they
    /// are ignored, as for every named object).
    pub fn ensure(&mut self, args: Vec<Value>) -> Outcome {
        match self.client.create(self.spec.spindle, &self.key, args, false, false) {
            Ok(_) => Ok(()),
            Err(Failure::Remote(r)) if r.kind == "ValueError" => {
                self.refused = Some(r.message);
                Ok(())
            }
            Err(e) => Err(self.error(e)),
        }
    }

    /// A call that answers at once.
    pub fn call(&mut self, method: &str, args: Vec<Value>) -> Result<Value, Failure> {
        self.client.call(self.spec.spindle, &self.key, method, args)
    }

    /// A call that may park in the server, at most `timeout` seconds (`None`: no limit).
    pub fn call_waiting(&mut self, method: &str, args: Vec<Value>, timeout: Option<f64>) -> Result<Value, Failure> {
        let wait = timeout.map(|t| Duration::try_from_secs_f64(t).unwrap_or(Duration::MAX));
        self.client
            .call_waiting(self.spec.spindle, &self.key, method, args, wait)
    }

    /// [`Self::call`] with every failure as its usual message.
    pub fn ask(&mut self, method: &str, args: Vec<Value>) -> Result<Value, Exit> {
        self.call(method, args).map_err(|e| self.error(e))
    }

    /// The usual message for a failed call.
    pub fn error(&self, failure: Failure) -> Exit {
        match failure {
            Failure::Connection(message) => Exit::Error(message),
            Failure::Remote(r) => match r.kind.as_str() {
                "NotFound" => Exit::Error(self.refused.clone().unwrap_or(r.message)),
                "TypeMismatch" | "ValueError" | "Moved" => Exit::Error(r.message),
                _ => Exit::Error(format!("{}: {}", r.kind, r.message)),
            },
        }
    }

    /// Whether `failure` says the object is gone (deleted while we waited, or never made).
    pub fn is_gone(failure: &Failure) -> bool {
        matches!(failure, Failure::Remote(r) if r.kind == "NotFound")
    }

    /// Whether `failure` is the server's error `kind`.
    pub fn is(failure: &Failure, kind: &str) -> bool {
        matches!(failure, Failure::Remote(r) if r.kind == kind)
    }

    /// `TYPE -n NAME delete`: only an object of this command's type.
    pub fn delete(&mut self) -> Outcome {
        let found = self.client.type_of(&self.key).map_err(|e| self.error(e))?;
        match found {
            None => Ok(()),
            Some(t) if t == self.spec.spindle => self.client.delete(&self.key).map(drop).map_err(|e| self.error(e)),
            Some(t) => Err(Exit::Error(format!(
                "'{}' is a {t}, not a {}",
                self.key, self.spec.spindle
            ))),
        }
    }
}
