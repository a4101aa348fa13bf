//! What cel-go's type checker and cost estimator do at compile time, for the device-selector
//! environment, over the `cel` crate's parsed tree (the crate has no checker):
//!
//! * an undeclared variable or function, an unknown field of `device`, and an operator or
//!   function applied to argument types it has no overload for are compile errors, worded as
//!   cel-go words them; a selector whose type is known and is not `bool` is rejected, as kube
//!   rejects it ("must evaluate to bool or the unknown type");
//! * the worst-case cost is estimated with the sizes kube declares (at most 32 domains, 32
//!   attributes per domain, 64-character attribute strings) and cel-go's unit costs; a
//!   comprehension over a collection of unknown size has an unbounded estimate, as in cel-go.
//!   The API server rejects a selector whose estimate exceeds the limit, and so do we, at
//!   compile time: this bounds the work of every evaluation.
//!
//! Values typed `dyn` (attribute values, comprehension variables) are checked at run time,
//! as cel-go checks them.

use cel::common::ast::{CallExpr, ComprehensionExpr, EntryExpr, Expr, IdedExpr, LiteralValue};

use super::values::Needs;

mod signatures;

use signatures::{SIGNATURES, Sig};

/// Kubernetes' `CELSelectorExpressionMaxCost`.
pub const COST_LIMIT: u64 = 1_000_000;
/// Deepest expression tree accepted. Evaluation recurses once per level on the caller's stack,
/// tens of KiB per level in a debug build, so this keeps it well within a 2 MiB thread stack.
/// cel-go's parser allows 250; selectors seen in practice stay under 15 (`&&` and `||` chains
/// are balanced, so each adds only log2 of its length).
pub(super) const MAX_DEPTH: u32 = 32;

/// `ResourceSliceMaxAttributesAndCapacitiesPerDevice`: bounds both map levels.
const MAX_MAP_ENTRIES: u64 = 32;
/// `DeviceAttributeMaxValueLength`.
const MAX_ATTRIBUTE_LEN: u64 = 64;
/// `DriverNameMaxLength`.
const MAX_DRIVER_LEN: u64 = 63;
/// cel-go's unit costs (`checker/cost.go`, `interpreter/runtimecost.go`).
const SELECT_COST: u64 = 1;
const LIST_CREATE_COST: u64 = 10;
const MAP_CREATE_COST: u64 = 30;
const CALL_COST: u64 = 1;

/// A static type, as far as this checker knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ty {
    Bool,
    Int,
    Uint,
    Double,
    String,
    Bytes,
    Null,
    List,
    Map,
    Quantity,
    Semver,
    Ip,
    Cidr,
    Type,
    Optional,
    Duration,
    Timestamp,
    Dyn,
    Device,
    AttrDomains,
    AttrMap,
    CapDomains,
    CapMap,
}

impl Ty {
    pub(super) fn name(self) -> &'static str {
        match self {
            Ty::Bool => "bool",
            Ty::Int => "int",
            Ty::Uint => "uint",
            Ty::Double => "double",
            Ty::String => "string",
            Ty::Bytes => "bytes",
            Ty::Null => "null_type",
            Ty::List => "list(dyn)",
            Ty::Map => "map(dyn, dyn)",
            Ty::Quantity => "kubernetes.Quantity",
            Ty::Semver => "kubernetes.Semver",
            Ty::Ip => "net.IP",
            Ty::Cidr => "net.CIDR",
            Ty::Type => "type",
            Ty::Optional => "optional_type(dyn)",
            Ty::Duration => "google.protobuf.Duration",
            Ty::Timestamp => "google.protobuf.Timestamp",
            Ty::Dyn => "dyn",
            Ty::Device => "kubernetes.DRADevice",
            Ty::AttrDomains => "map(string, map(string, dyn))",
            Ty::AttrMap => "map(string, dyn)",
            Ty::CapDomains => "map(string, map(string, kubernetes.Quantity))",
            Ty::CapMap => "map(string, kubernetes.Quantity)",
        }
    }

    fn is_map(self) -> bool {
        matches!(
            self,
            Ty::Map | Ty::AttrDomains | Ty::AttrMap | Ty::CapDomains | Ty::CapMap
        )
    }

    fn is_number(self) -> bool {
        matches!(self, Ty::Int | Ty::Uint | Ty::Double)
    }

    /// Whether a parameter declared `self` accepts an argument of static type `arg`.
    fn accepts(self, arg: Ty) -> bool {
        self == Ty::Dyn || arg == Ty::Dyn || self == arg || (self == Ty::Map && arg.is_map())
    }

    /// Equality classes: values of different classes never compare equal in checked CEL.
    fn class(self) -> Option<u8> {
        Some(match self {
            Ty::Bool => 0,
            Ty::Int | Ty::Uint | Ty::Double => 1,
            Ty::String => 2,
            Ty::Bytes => 3,
            Ty::List => 4,
            t if t.is_map() => 5,
            Ty::Quantity => 6,
            Ty::Semver => 7,
            Ty::Ip => 8,
            Ty::Cidr => 9,
            Ty::Duration => 10,
            Ty::Timestamp => 11,
            Ty::Type => 12,
            Ty::Device => 13,
            _ => return None,
        })
    }
}

/// What the checker knows of a subexpression: its type, its worst-case cost, and the most
/// elements (or characters) it can have, if bounded.
#[derive(Debug, Clone, Copy)]
pub(super) struct Info {
    pub ty: Ty,
    pub cost: u64,
    pub size: Option<u64>,
}

impl Info {
    fn new(ty: Ty, cost: u64, size: Option<u64>) -> Self {
        Info { ty, cost, size }
    }
}

/// A compile error at expression `id`.
#[derive(Debug)]
pub(super) struct Issue {
    pub id: u64,
    pub message: String,
}

fn issue<T>(id: u64, message: impl Into<String>) -> Result<T, Issue> {
    Err(Issue {
        id,
        message: message.into(),
    })
}

/// The checker's result for a whole expression.
#[derive(Debug)]
pub(super) struct Checked {
    pub info: Info,
    pub needs: Needs,
}

pub(super) fn check(root: &IdedExpr) -> Result<Checked, Issue> {
    let mut c = Checker {
        scopes: Vec::new(),
        needs: Needs {
            attributes: false,
            capacity: false,
        },
        depth: 0,
    };
    let info = c.expr(root)?;
    Ok(Checked { info, needs: c.needs })
}

struct Checker {
    scopes: Vec<(String, Info)>,
    needs: Needs,
    depth: u32,
}

/// Type names an expression may use as values (`type(x) == int`).
const TYPE_NAMES: &[&str] = &[
    "bool",
    "int",
    "uint",
    "double",
    "string",
    "bytes",
    "list",
    "map",
    "null_type",
    "type",
    "dyn",
];

fn sum(costs: impl IntoIterator<Item = u64>) -> u64 {
    costs.into_iter().fold(0, u64::saturating_add)
}

impl Checker {
    fn lookup(&self, name: &str) -> Option<Info> {
        self.scopes.iter().rev().find(|(n, _)| n == name).map(|(_, i)| *i)
    }

    fn expr(&mut self, e: &IdedExpr) -> Result<Info, Issue> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return issue(
                e.id,
                format!("expression nested more than {MAX_DEPTH} levels deep"),
            );
        }
        let r = self.expr_inner(e);
        self.depth -= 1;
        r
    }

    fn expr_inner(&mut self, e: &IdedExpr) -> Result<Info, Issue> {
        match &e.expr {
            Expr::Unspecified => issue(e.id, "unsupported expression"),
            Expr::Literal(l) => Ok(match l {
                LiteralValue::Boolean(_) => Info::new(Ty::Bool, 0, None),
                LiteralValue::Bytes(b) => Info::new(Ty::Bytes, 0, Some(b.inner().len() as u64)),
                LiteralValue::Double(_) => Info::new(Ty::Double, 0, None),
                LiteralValue::Int(_) => Info::new(Ty::Int, 0, None),
                LiteralValue::Null => Info::new(Ty::Null, 0, None),
                LiteralValue::String(s) => Info::new(Ty::String, 0, Some(s.inner().chars().count() as u64)),
                LiteralValue::UInt(_) => Info::new(Ty::Uint, 0, None),
            }),
            Expr::Ident(name) => self.ident(e.id, name),
            Expr::Select(sel) => {
                let operand = self.expr(&sel.operand)?;
                let field = self.field(e.id, operand, &sel.field)?;
                if sel.test {
                    Ok(Info::new(Ty::Bool, field.cost, None))
                } else {
                    Ok(field)
                }
            }
            Expr::Call(call) => self.call(e.id, call),
            Expr::List(list) => {
                let mut cost = LIST_CREATE_COST;
                for el in &list.elements {
                    cost = cost.saturating_add(self.expr(el)?.cost);
                }
                Ok(Info::new(Ty::List, cost, Some(list.elements.len() as u64)))
            }
            Expr::Map(map) => {
                let mut cost = MAP_CREATE_COST;
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(m) => {
                            cost = sum([cost, self.expr(&m.key)?.cost, self.expr(&m.value)?.cost]);
                        }
                        EntryExpr::StructField(_) => return issue(entry.id, "unexpected struct field"),
                    }
                }
                Ok(Info::new(Ty::Map, cost, Some(map.entries.len() as u64)))
            }
            Expr::Struct(s) => issue(
                e.id,
                format!("undeclared reference to '{}' (in container '')", s.type_name),
            ),
            Expr::Comprehension(c) => self.comprehension(e.id, c),
        }
    }

    fn ident(&mut self, id: u64, name: &str) -> Result<Info, Issue> {
        if let Some(info) = self.lookup(name) {
            return Ok(Info {
                cost: SELECT_COST,
                ..info
            });
        }
        if name == "device" {
            // Used as a whole (bound, put in a list, ...): build everything.
            self.needs.attributes = true;
            self.needs.capacity = true;
            return Ok(Info::new(Ty::Device, SELECT_COST, None));
        }
        if TYPE_NAMES.contains(&name) {
            return Ok(Info::new(Ty::Type, SELECT_COST, None));
        }
        issue(id, format!("undeclared reference to '{name}' (in container '')"))
    }

    /// `operand.field`.
    fn field(&mut self, id: u64, operand: Info, field: &str) -> Result<Info, Issue> {
        let cost = operand.cost.saturating_add(SELECT_COST);
        let (ty, size) = match operand.ty {
            Ty::Device => match field {
                "driver" => (Ty::String, Some(MAX_DRIVER_LEN)),
                "attributes" => {
                    self.needs.attributes = true;
                    (Ty::AttrDomains, Some(MAX_MAP_ENTRIES))
                }
                "capacity" => {
                    self.needs.capacity = true;
                    (Ty::CapDomains, Some(MAX_MAP_ENTRIES))
                }
                "allowMultipleAllocations" => (Ty::Bool, None),
                _ => return issue(id, format!("undefined field '{field}'")),
            },
            Ty::AttrDomains => (Ty::AttrMap, Some(MAX_MAP_ENTRIES)),
            Ty::AttrMap => (Ty::Dyn, Some(MAX_ATTRIBUTE_LEN)),
            Ty::CapDomains => (Ty::CapMap, Some(MAX_MAP_ENTRIES)),
            Ty::CapMap => (Ty::Quantity, None),
            Ty::Map | Ty::Dyn => (Ty::Dyn, None),
            Ty::Optional => (Ty::Optional, None),
            t => {
                return issue(
                    id,
                    format!("type '{}' does not support field selection", t.name()),
                );
            }
        };
        Ok(Info::new(ty, cost, size))
    }

    fn comprehension(&mut self, id: u64, c: &ComprehensionExpr) -> Result<Info, Issue> {
        let range = self.expr(&c.iter_range)?;
        let elem = match range.ty {
            Ty::List | Ty::Dyn => Info::new(Ty::Dyn, SELECT_COST, None),
            Ty::AttrDomains | Ty::AttrMap | Ty::CapDomains | Ty::CapMap => {
                Info::new(Ty::String, SELECT_COST, Some(MAX_ATTRIBUTE_LEN))
            }
            Ty::Map => Info::new(Ty::Dyn, SELECT_COST, None),
            t => {
                return issue(
                    c.iter_range.id,
                    format!(
                        "expression of type '{}' cannot be range of a comprehension (must be list, map, or dynamic)",
                        t.name()
                    ),
                );
            }
        };
        let _ = id;
        let init = self.expr(&c.accu_init)?;
        self.scopes.push((c.accu_var.clone(), init));
        self.scopes.push((c.iter_var.clone(), elem));
        let cond = self.expr(&c.loop_cond);
        let step = self.expr(&c.loop_step);
        self.scopes.pop();
        let (cond, step) = match (cond, step) {
            (Ok(c), Ok(s)) => (c, s),
            (Err(e), _) | (_, Err(e)) => {
                self.scopes.pop();
                return Err(e);
            }
        };
        let result = self.expr(&c.result);
        self.scopes.pop();
        let result = result?;
        let n = range.size.unwrap_or(u64::MAX);
        let per_item = cond.cost.saturating_add(step.cost);
        let cost = sum([
            range.cost,
            init.cost,
            n.saturating_mul(per_item.max(1)),
            result.cost,
        ]);
        let size = if c.iter_var == "#unused" {
            result.size
        } else if result.ty == Ty::List {
            range.size
        } else {
            None
        };
        Ok(Info::new(result.ty, cost, size))
    }

    fn call(&mut self, id: u64, call: &CallExpr) -> Result<Info, Issue> {
        let name = call.func_name.as_str();
        // A namespaced function (`sets.contains(..)`) parses as a call on `sets`.
        if let Some(target) = &call.target
            && let Some(qualified) = self.namespaced(target, name)
        {
            let args = self.args(&call.args)?;
            let mut info = self.overload(id, &qualified, None, &args)?;
            if qualified == "lists.range"
                && let [
                    IdedExpr {
                        expr: Expr::Literal(LiteralValue::Int(n)),
                        ..
                    },
                ] = call.args.as_slice()
            {
                info.size = u64::try_from(*n.inner()).ok();
            }
            return Ok(info);
        }
        let target = match &call.target {
            Some(t) => Some(self.expr(t)?),
            None => None,
        };
        let args = self.args(&call.args)?;
        if target.is_none()
            && let Some(info) = self.operator(id, name, &args)?
        {
            return Ok(info);
        }
        self.overload(id, name, target, &args)
    }

    fn args(&mut self, args: &[IdedExpr]) -> Result<Vec<Info>, Issue> {
        args.iter().map(|a| self.expr(a)).collect()
    }

    fn namespaced(&self, target: &IdedExpr, name: &str) -> Option<String> {
        let mut segments = Vec::new();
        let mut e = target;
        loop {
            match &e.expr {
                Expr::Ident(n) => {
                    segments.push(n.as_str());
                    break;
                }
                Expr::Select(s) if !s.test => {
                    segments.push(s.field.as_str());
                    e = &s.operand;
                }
                _ => return None,
            }
        }
        segments.reverse();
        let root = segments.first()?;
        if self.lookup(root).is_some() || *root == "device" {
            return None;
        }
        let qualified = format!("{}.{name}", segments.join("."));
        SIGNATURES
            .iter()
            .any(|s| !s.member && s.name == qualified)
            .then_some(qualified)
    }

    /// The operators, or `None` for any other function.
    fn operator(&mut self, id: u64, name: &str, args: &[Info]) -> Result<Option<Info>, Issue> {
        let cost = sum(args.iter().map(|a| a.cost)).saturating_add(CALL_COST);
        let types: Vec<Ty> = args.iter().map(|a| a.ty).collect();
        let no_overload = || {
            issue(
                id,
                format!(
                    "found no matching overload for '{name}' applied to '({})'",
                    types.iter().map(|t| t.name()).collect::<Vec<_>>().join(", ")
                ),
            )
        };
        let bool_like = |t: Ty| t == Ty::Bool || t == Ty::Dyn;
        let info = |ty, size| Ok(Some(Info::new(ty, cost, size)));
        match (name, types.as_slice()) {
            ("_&&_" | "_||_", [a, b]) => {
                if bool_like(*a) && bool_like(*b) {
                    info(Ty::Bool, None)
                } else {
                    no_overload()
                }
            }
            ("!_" | "@not_strictly_false", [a]) => {
                if bool_like(*a) {
                    info(Ty::Bool, None)
                } else {
                    no_overload()
                }
            }
            ("_?_:_", [c, a, b]) => {
                if !bool_like(*c) {
                    return no_overload();
                }
                let ty = if a == b { *a } else { Ty::Dyn };
                let size = args[1].size.zip(args[2].size).map(|(x, y)| x.max(y));
                info(ty, size)
            }
            ("_==_" | "_!=_", [a, b]) => match (a.class(), b.class()) {
                (Some(x), Some(y)) if x != y => no_overload(),
                _ => info(Ty::Bool, None),
            },
            ("_<_" | "_<=_" | "_>_" | "_>=_", [a, b]) => {
                let ok = *a == Ty::Dyn
                    || *b == Ty::Dyn
                    || (a.is_number() && b.is_number())
                    || (a == b
                        && matches!(
                            a,
                            Ty::String | Ty::Bytes | Ty::Bool | Ty::Duration | Ty::Timestamp
                        ));
                if ok { info(Ty::Bool, None) } else { no_overload() }
            }
            ("_+_", [a, b]) => {
                let size = args[0].size.zip(args[1].size).map(|(x, y)| x.saturating_add(y));
                match (a, b) {
                    (Ty::Dyn, _) | (_, Ty::Dyn) => info(Ty::Dyn, None),
                    (x, y) if x == y && matches!(x, Ty::Int | Ty::Uint | Ty::Double | Ty::Duration) => {
                        info(*x, None)
                    }
                    (x, y) if x == y && matches!(x, Ty::String | Ty::Bytes | Ty::List) => info(*x, size),
                    (Ty::Timestamp, Ty::Duration) | (Ty::Duration, Ty::Timestamp) => {
                        info(Ty::Timestamp, None)
                    }
                    _ => no_overload(),
                }
            }
            ("_-_", [a, b]) => match (a, b) {
                (Ty::Dyn, _) | (_, Ty::Dyn) => info(Ty::Dyn, None),
                (x, y) if x == y && matches!(x, Ty::Int | Ty::Uint | Ty::Double | Ty::Duration) => {
                    info(*x, None)
                }
                (Ty::Timestamp, Ty::Timestamp) => info(Ty::Duration, None),
                (Ty::Timestamp, Ty::Duration) => info(Ty::Timestamp, None),
                _ => no_overload(),
            },
            ("_*_" | "_/_" | "_%_", [a, b]) => match (a, b) {
                (Ty::Dyn, _) | (_, Ty::Dyn) => info(Ty::Dyn, None),
                (x, y) if x == y && matches!(x, Ty::Int | Ty::Uint) => info(*x, None),
                (Ty::Double, Ty::Double) if name != "_%_" => info(Ty::Double, None),
                _ => no_overload(),
            },
            ("-_", [a]) => match a {
                Ty::Int | Ty::Double | Ty::Duration | Ty::Dyn => info(*a, None),
                _ => no_overload(),
            },
            ("@in", [_, b]) => {
                if *b == Ty::List || *b == Ty::Dyn || b.is_map() {
                    info(Ty::Bool, None)
                } else {
                    no_overload()
                }
            }
            ("_[_]", [a, b]) => {
                let key_ok = |k: Ty| k == Ty::String || k == Ty::Dyn;
                match a {
                    Ty::AttrDomains if key_ok(*b) => info(Ty::AttrMap, Some(MAX_MAP_ENTRIES)),
                    Ty::AttrMap if key_ok(*b) => info(Ty::Dyn, Some(MAX_ATTRIBUTE_LEN)),
                    Ty::CapDomains if key_ok(*b) => info(Ty::CapMap, Some(MAX_MAP_ENTRIES)),
                    Ty::CapMap if key_ok(*b) => info(Ty::Quantity, None),
                    Ty::List if matches!(b, Ty::Int | Ty::Uint | Ty::Dyn) => info(Ty::Dyn, None),
                    Ty::Map | Ty::Dyn => info(Ty::Dyn, None),
                    _ => no_overload(),
                }
            }
            ("_[?_]" | "_?._", [a, _]) => {
                if matches!(a, Ty::List | Ty::Dyn | Ty::Optional) || a.is_map() {
                    info(Ty::Optional, None)
                } else {
                    no_overload()
                }
            }
            _ if name.starts_with('_') || name == "@in" || name == "-_" || name == "!_" => no_overload(),
            _ => Ok(None),
        }
    }

    /// A function call, resolved against [`SIGNATURES`].
    fn overload(&mut self, id: u64, name: &str, target: Option<Info>, args: &[Info]) -> Result<Info, Issue> {
        let member = target.is_some();
        let all: Vec<Info> = target.iter().copied().chain(args.iter().copied()).collect();
        let named: Vec<&Sig> = SIGNATURES
            .iter()
            .filter(|s| s.name == name && s.member == member)
            .collect();
        if named.is_empty() {
            return issue(id, format!("undeclared reference to '{name}' (in container '')"));
        }
        let matching: Vec<&Sig> = named
            .into_iter()
            .filter(|s| {
                s.params.len() == all.len() && s.params.iter().zip(&all).all(|(p, a)| p.accepts(a.ty))
            })
            .collect();
        let Some(first) = matching.first() else {
            let types: Vec<&str> = all.iter().map(|a| a.ty.name()).collect();
            let applied = if member {
                format!("{}.({})", types[0], types[1..].join(", "))
            } else {
                format!("({})", types.join(", "))
            };
            return issue(
                id,
                format!("found no matching overload for '{name}' applied to '{applied}'"),
            );
        };
        let ret = if matching.iter().all(|s| s.ret == first.ret) {
            first.ret
        } else {
            Ty::Dyn
        };
        let known_len: Option<u64> = all
            .iter()
            .filter(|a| matches!(a.ty, Ty::String | Ty::List | Ty::Bytes))
            .map(|a| a.size)
            .try_fold(0u64, |acc, s| s.map(|s| acc.saturating_add(s)));
        // cel-go charges string and list functions by the size they traverse (0.1 per char).
        let traversal = known_len.map_or(0, |n| n.div_ceil(10));
        let cost = sum(all.iter().map(|a| a.cost)).saturating_add(CALL_COST + traversal);
        let receiver_size = target.and_then(|t| t.size);
        let size = match (name, ret) {
            ("split", _) => receiver_size.map(|n| n.saturating_add(1)),
            ("lists.range", _) => None,
            ("@pairs", _) => all.first().and_then(|a| a.size),
            ("slice" | "distinct" | "reverse" | "sort" | "findAll" | "@sortByAssociatedKeys", _) => {
                receiver_size
            }
            (_, Ty::String) => known_len,
            _ => None,
        };
        Ok(Info::new(ret, cost, size))
    }
}
