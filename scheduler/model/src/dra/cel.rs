//! CEL device selectors (`DeviceClass.spec.selectors[].cel`, `requests[].exactly.selectors[].cel`,
//! firstAvailable subrequests): compiled once per expression, evaluated per device, in the
//! environment kube-scheduler v1.36 gives them.
//!
//! The `device` variable has `driver`, `attributes[domain][id]` (bool, int, string, or a semver
//! for version attributes), `capacity[domain][id]` (a quantity) and `allowMultipleAllocations`.
//! A name without a domain is under the driver's; an unknown domain reads as an empty map, so
//! `device.attributes["other.com"].x` fails with "no such key" while
//! `"x" in device.attributes["other.com"]` is false. List attributes are not exposed
//! (DRAListTypeAttributes is off by default in v1.36).
//!
//! The `cel` crate parses and interprets; [`check`] does what cel-go's checker does at compile
//! time (undeclared names, overloads, the bool result, the cost estimate), and [`library`]
//! adds Kubernetes' functions.

mod check;
mod library;
mod twovar;
mod values;

use std::collections::HashMap;
use std::sync::Arc;

use cel::common::types::CelBool;
use cel::{Context, ExecutionError, Value};
use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};

use super::slice::DeviceMap;

use self::values::Needs;

pub use self::check::COST_LIMIT;

/// `CELSelectorExpressionMaxLength`: the API server accepts no longer selector.
pub const MAX_EXPRESSION_LEN: usize = 10 * 1024;
/// Brackets nested deeper are refused before parsing (cel-go's parser limit).
const MAX_BRACKET_DEPTH: u32 = 250;
/// Stack of the compiling thread: enough for the crate's parser on the longest expression.
const COMPILE_STACK: usize = 256 << 20;

/// Why a selector could not be compiled or evaluated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CelError {
    /// The expression does not compile (syntax, unknown function, wrong result type).
    #[error("compile CEL selector `{expression}`: {reason}")]
    Compile { expression: String, reason: String },
    /// The expression compiled but failed on this device (no such key, type mismatch, ...).
    #[error("evaluate CEL selector `{expression}` on device {device}: {reason}")]
    Evaluate {
        expression: String,
        device: String,
        reason: String,
    },
    /// The evaluation exceeded the cost limit (1,000,000, as the API server's).
    #[error("evaluate CEL selector `{expression}`: cost limit exceeded")]
    CostLimit { expression: String },
}

/// One device as a selector sees it (`device.driver`, `device.attributes`, `device.capacity`,
/// `device.allowMultipleAllocations`). Names are as written in the ResourceSlice: a name
/// without a domain belongs to the driver's domain.
#[derive(Debug, Clone, Copy)]
pub struct DeviceView<'a> {
    pub driver: &'a str,
    /// `driver/pool/device`, for error messages.
    pub id: &'a str,
    pub attributes: Option<&'a DeviceMap<DeviceAttribute>>,
    pub capacity: Option<&'a DeviceMap<DeviceCapacity>>,
    pub allow_multiple_allocations: Option<bool>,
}

/// A compiled selector. Cloning is cheap (the program is shared).
#[derive(Debug, Clone)]
pub struct Selector {
    expression: String,
    program: Arc<cel::Program>,
    needs: Needs,
    cost: u64,
}

impl Selector {
    /// Compiles `expression`: parse, check names and types as cel-go's checker does, and
    /// estimate the worst-case cost, which must stay within [`COST_LIMIT`].
    pub fn compile(expression: &str) -> Result<Self, CelError> {
        let compile_error = |reason: String| CelError::Compile {
            expression: expression.to_owned(),
            reason,
        };
        if expression.len() > MAX_EXPRESSION_LEN {
            return Err(compile_error(format!(
                "compilation failed: expression is longer than {MAX_EXPRESSION_LEN} bytes, the API server's limit"
            )));
        }
        // The crate's ANTLR parser recurses deeply per nesting level (tens of KiB per level in
        // a debug build), so parsing and checking run on a thread with a stack that fits the
        // longest accepted expression; the checked tree is shallow enough for any thread.
        std::thread::scope(|scope| {
            std::thread::Builder::new()
                .name("cel-compile".into())
                .stack_size(COMPILE_STACK)
                .spawn_scoped(scope, || Self::compile_here(expression))
                .map_err(|e| compile_error(format!("cannot start the compiler thread: {e}")))?
                .join()
                .unwrap_or_else(|_| Err(compile_error("the CEL compiler failed unexpectedly".into())))
        })
    }

    fn compile_here(expression: &str) -> Result<Self, CelError> {
        let compile_error = |reason: String| CelError::Compile {
            expression: expression.to_owned(),
            reason,
        };
        let env = library::ENV
            .as_ref()
            .map_err(|e| compile_error(format!("CEL environment unavailable: {e}")))?;
        if let Some(reason) = too_deep(expression) {
            return Err(compile_error(reason));
        }
        let program = env
            .compile(expression)
            .map_err(|errors| compile_error(parse_errors(expression, &errors)))?;
        let checked = check::check(program.expression()).map_err(|issue| {
            let pos = program
                .source_info()
                .offset_for(issue.id)
                .map_or(0, |(start, _)| start as usize);
            compile_error(located(expression, pos, &issue.message))
        })?;
        if !matches!(checked.info.ty, check::Ty::Bool | check::Ty::Dyn) {
            return Err(compile_error(format!(
                "must evaluate to bool or the unknown type, not {}",
                checked.info.ty.name()
            )));
        }
        if checked.info.cost > COST_LIMIT {
            return Err(CelError::CostLimit {
                expression: expression.to_owned(),
            });
        }
        Ok(Selector {
            expression: expression.to_owned(),
            program: Arc::new(program),
            needs: checked.needs,
            cost: checked.info.cost,
        })
    }

    /// The source text.
    pub fn expression(&self) -> &str {
        &self.expression
    }

    /// The worst-case cost estimate, at most [`COST_LIMIT`].
    pub fn estimated_cost(&self) -> u64 {
        self.cost
    }

    /// Whether `device` matches.
    pub fn matches(&self, device: &DeviceView<'_>) -> Result<bool, CelError> {
        let evaluate_error = |reason: String| CelError::Evaluate {
            expression: self.expression.clone(),
            device: device.id.to_owned(),
            reason,
        };
        let env = library::ENV
            .as_ref()
            .map_err(|e| evaluate_error(format!("CEL environment unavailable: {e}")))?;
        let obj = values::device_obj(device, self.needs).map_err(evaluate_error)?;
        let mut ctx = Context::with_env(Arc::clone(env));
        ctx.add_variable_as_val("device", Box::new(obj));
        let result = Value::resolve_val(self.program.expression(), &ctx)
            .map_err(|e| evaluate_error(runtime_error(&e)))?;
        match result.downcast_ref::<CelBool>() {
            Some(b) => Ok(*b.inner()),
            None => Err(evaluate_error(format!(
                "CEL result of type {} could not be converted to bool",
                result.get_type().name()
            ))),
        }
    }
}

/// Compiled selectors by expression text: each distinct expression is compiled once, and a
/// compile error is remembered as well.
#[derive(Debug, Default)]
pub struct SelectorCache {
    compiled: HashMap<String, Result<Selector, CelError>>,
}

impl SelectorCache {
    pub fn new() -> Self {
        Self::default()
    }

    /// The compiled `expression`, compiling it on first use.
    pub fn get(&mut self, expression: &str) -> Result<&Selector, CelError> {
        if !self.compiled.contains_key(expression) {
            let compiled = Selector::compile(expression);
            self.compiled.insert(expression.to_owned(), compiled);
        }
        match self.compiled.get(expression) {
            Some(entry) => entry.as_ref().map_err(Clone::clone),
            None => Err(CelError::Compile {
                expression: expression.to_owned(),
                reason: "selector cache lost its entry".into(),
            }),
        }
    }

    /// How many distinct expressions are cached.
    pub fn len(&self) -> usize {
        self.compiled.len()
    }

    pub fn is_empty(&self) -> bool {
        self.compiled.is_empty()
    }
}

/// Brackets nested deeper than the parser's recursion limit are rejected before parsing, so
/// that no recursive pass over the tree can exhaust the stack.
fn too_deep(expression: &str) -> Option<String> {
    let mut depth: u32 = 0;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for c in expression.chars() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '(' | '[' | '{' => {
                depth += 1;
                if depth > MAX_BRACKET_DEPTH {
                    return Some(format!(
                        "compilation failed: expression nested more than {MAX_BRACKET_DEPTH} levels deep"
                    ));
                }
            }
            ')' | ']' | '}' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    None
}

/// cel-go's error layout: `ERROR: <input>:line:col: message`, the line, and a caret.
fn located(expression: &str, byte_offset: usize, message: &str) -> String {
    let offset = byte_offset.min(expression.len());
    let before = expression.get(..offset).unwrap_or(expression);
    let line_no = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let col = expression
        .get(line_start..offset)
        .map_or(0, |s| s.chars().count());
    let line = expression[line_start..].lines().next().unwrap_or("");
    format!(
        "compilation failed: ERROR: <input>:{line_no}:{}: {message}\n | {line}\n | {}^",
        col + 1,
        ".".repeat(col)
    )
}

fn parse_errors(expression: &str, errors: &cel::ParseErrors) -> String {
    let mut out = String::from("compilation failed: ");
    for (i, e) in errors.errors.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let (line, col) = (e.pos.0.max(1) as usize, e.pos.1.max(1) as usize);
        let text = expression.lines().nth(line - 1).unwrap_or("");
        out.push_str(&format!(
            "ERROR: <input>:{line}:{col}: {}\n | {text}\n | {}^",
            e.msg,
            ".".repeat(col - 1)
        ));
    }
    out
}

/// Runtime errors, worded as cel-go words them where they differ.
fn runtime_error(e: &ExecutionError) -> String {
    match e {
        ExecutionError::NoSuchKey(k) => format!("no such key: {k}"),
        ExecutionError::UndeclaredReference(n) => format!("undeclared reference to '{n}'"),
        ExecutionError::DivisionByZero(_) => "division by zero".into(),
        ExecutionError::RemainderByZero(_) => "modulus by zero".into(),
        ExecutionError::Overflow(..) => "integer overflow".into(),
        ExecutionError::FunctionError { function, message } => format!("{function}: {message}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests;
