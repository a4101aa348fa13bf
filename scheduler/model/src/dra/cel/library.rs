//! The CEL environment of device selectors: the `cel` crate's standard library and its strings
//! and lists extensions, plus what Kubernetes' base environment adds and the crate lacks
//! (`cel.bind`, quantity, semver, regex `find`/`findAll`, Kubernetes' list functions, sets,
//! IP and CIDR, `first`/`last`).

use std::cmp::Ordering;
use std::sync::{Arc, LazyLock};

use cel::common::ast::{ComprehensionExpr, Expr, IdedExpr, ListExpr, LiteralValue};
use cel::common::types::{
    BOOL_TYPE, CelBool, CelDouble, CelInt, CelList, CelOptional, CelString, INT_TYPE, LIST_TYPE, STRING_TYPE,
};
use cel::common::value::{CowVal, FromVal, Val};
use cel::parser::{Macro, MacroExprHelper, ParseError};
use cel::{DeclarationError, Env, ExecutionError, extensions};
use numaplane::quantity::{Format, Quantity};

use super::values::{CIDR_TYPE, IP_TYPE, QUANTITY_TYPE, QuantityVal, SEMVER_TYPE, SemverVal, parse_semver};

mod ip;

use ip::ip_lib;

/// Most elements `findAll` returns without a limit, and the most a regex may compile to.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// The environment, built once. A failure to build it is a bug, reported on every compile.
pub(super) static ENV: LazyLock<Result<Arc<Env>, String>> =
    LazyLock::new(|| build().map(Arc::new).map_err(|e| e.to_string()));

fn build() -> Result<Env, DeclarationError> {
    let mut env = Env::stdlib();
    env.add_extension(extensions::strings)?;
    env.add_extension(extensions::lists)?;
    env.add_macro(Macro::receiver("bind", 3, bind_macro))?;
    super::twovar::register(&mut env)?;
    for t in [
        &QUANTITY_TYPE,
        &SEMVER_TYPE,
        &IP_TYPE,
        &CIDR_TYPE,
        &super::values::DEVICE_TYPE,
    ] {
        env.add_type(t.to_owned())?;
    }
    quantity(&mut env)?;
    semver_lib(&mut env)?;
    regex_lib(&mut env)?;
    kube_lists(&mut env)?;
    sets(&mut env)?;
    ip_lib(&mut env)?;
    Ok(env)
}

type R<'b, 'v> = Result<CowVal<'b, 'v>, ExecutionError>;

/// Argument `i`, downcast to `T`; an overload is only called with the types it was declared
/// for, so a mismatch is an internal error, reported, not a panic.
fn arg<'a, 'b, 'v, T: FromVal<'a, 'v>>(
    args: &'a [CowVal<'b, 'v>],
    i: usize,
) -> Result<&'a T, ExecutionError> {
    args.get(i)
        .and_then(|v| v.as_ref().downcast_ref::<T>())
        .ok_or_else(|| ExecutionError::InternalError(format!("argument {i} has an unexpected type")))
}

fn s<'a>(args: &'a [CowVal<'_, '_>], i: usize) -> Result<&'a str, ExecutionError> {
    arg::<CelString<'_>>(args, i).map(CelString::inner)
}

fn int(args: &[CowVal<'_, '_>], i: usize) -> Result<i64, ExecutionError> {
    arg::<CelInt>(args, i).map(|v| *v.inner())
}

fn boolean(args: &[CowVal<'_, '_>], i: usize) -> Result<bool, ExecutionError> {
    arg::<CelBool>(args, i).map(|v| *v.inner())
}

fn owned<'b, 'v>(v: impl Val + 'v) -> R<'b, 'v> {
    Ok(CowVal::owned(v))
}

fn ordering(o: Ordering) -> i64 {
    match o {
        Ordering::Less => -1,
        Ordering::Equal => 0,
        Ordering::Greater => 1,
    }
}

/// `cel.bind(name, init, body)`: `body` with `name` bound to `init`, evaluated once (cel-go's
/// `ext.Bindings`), as the comprehension cel-go expands it to.
fn bind_macro(
    helper: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Option<IdedExpr>, ParseError> {
    if !matches!(target.as_ref().map(|t| &t.expr), Some(Expr::Ident(name)) if name == "cel") {
        return Ok(None);
    }
    let (Some(body), Some(init), Some(var)) = (args.pop(), args.pop(), args.pop()) else {
        return Err(helper.new_error(0, "cel.bind takes three arguments"));
    };
    let Expr::Ident(name) = &var.expr else {
        return Err(helper.new_error(var.id, "cel.bind() variable name must be a simple identifier"));
    };
    let name = name.to_owned();
    let range = helper.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let cond = helper.next_expr(Expr::Literal(LiteralValue::Boolean(false.into())));
    let step = helper.next_expr(Expr::Ident(name.clone()));
    Ok(Some(helper.next_expr(Expr::Comprehension(Box::new(
        ComprehensionExpr {
            iter_range: range,
            iter_var: "#unused".to_owned(),
            iter_var2: None,
            accu_var: name,
            accu_init: init,
            loop_cond: cond,
            loop_step: step,
            result: body,
        },
    )))))
}

// ---- Kubernetes quantity library -------------------------------------------------------------

fn quantity(env: &mut Env) -> Result<(), DeclarationError> {
    let q = || QUANTITY_TYPE.to_owned();
    env.add_overload("quantity", "string_to_quantity", vec![STRING_TYPE], |a| {
        let q = Quantity::parse(s(&a, 0)?).map_err(|e| ExecutionError::function_error("quantity", e))?;
        owned(QuantityVal(q))
    })?;
    env.add_overload("isQuantity", "is_quantity_string", vec![STRING_TYPE], |a| {
        owned(CelBool::from(Quantity::parse(s(&a, 0)?).is_ok()))
    })?;
    env.add_overload("sign", "quantity_sign", vec![q()], |a| {
        let q = arg::<QuantityVal>(&a, 0)?.0;
        owned(CelInt::from(ordering(q.cmp(&Quantity::default()))))
    })?;
    env.add_member_overload("isGreaterThan", "quantity_is_greater_than", q(), vec![q()], |a| {
        let (x, y) = (arg::<QuantityVal>(&a, 0)?.0, arg::<QuantityVal>(&a, 1)?.0);
        owned(CelBool::from(x > y))
    })?;
    env.add_member_overload("isLessThan", "quantity_is_less_than", q(), vec![q()], |a| {
        let (x, y) = (arg::<QuantityVal>(&a, 0)?.0, arg::<QuantityVal>(&a, 1)?.0);
        owned(CelBool::from(x < y))
    })?;
    env.add_member_overload("compareTo", "quantity_compare_to", q(), vec![q()], |a| {
        let (x, y) = (arg::<QuantityVal>(&a, 0)?.0, arg::<QuantityVal>(&a, 1)?.0);
        owned(CelInt::from(ordering(x.cmp(&y))))
    })?;
    env.add_member_overload("asApproximateFloat", "quantity_get_float", q(), vec![], |a| {
        let q = arg::<QuantityVal>(&a, 0)?.0;
        // Exact nanos, one correctly rounded division: Go's AsApproximateFloat64 may differ in
        // the last bit for values beyond 2^53 nanos.
        owned(CelDouble::from(q.nanos() as f64 / 1e9))
    })?;
    env.add_member_overload("asInteger", "quantity_get_int", q(), vec![], |a| {
        let q = arg::<QuantityVal>(&a, 0)?.0;
        let v = q
            .as_i64_exact()
            .ok_or_else(|| ExecutionError::function_error("asInteger", "cannot convert value to integer"))?;
        owned(CelInt::from(v))
    })?;
    env.add_member_overload("isInteger", "quantity_is_integer", q(), vec![], |a| {
        let q = arg::<QuantityVal>(&a, 0)?.0;
        owned(CelBool::from(q.as_i64_exact().is_some()))
    })?;
    env.add_member_overload("add", "quantity_add", q(), vec![q()], |a| {
        let (x, y) = (arg::<QuantityVal>(&a, 0)?.0, arg::<QuantityVal>(&a, 1)?.0);
        owned(QuantityVal(x.checked_add(y).ok_or_else(|| overflow("add"))?))
    })?;
    env.add_member_overload("add", "quantity_add_int", q(), vec![INT_TYPE], |a| {
        let (x, y) = (
            arg::<QuantityVal>(&a, 0)?.0,
            Quantity::from_int(int(&a, 1)?, Format::DecimalExponent),
        );
        owned(QuantityVal(x.checked_add(y).ok_or_else(|| overflow("add"))?))
    })?;
    env.add_member_overload("sub", "quantity_sub", q(), vec![q()], |a| {
        let (x, y) = (arg::<QuantityVal>(&a, 0)?.0, arg::<QuantityVal>(&a, 1)?.0);
        owned(QuantityVal(x.checked_sub(y).ok_or_else(|| overflow("sub"))?))
    })?;
    env.add_member_overload("sub", "quantity_sub_int", q(), vec![INT_TYPE], |a| {
        let (x, y) = (
            arg::<QuantityVal>(&a, 0)?.0,
            Quantity::from_int(int(&a, 1)?, Format::DecimalExponent),
        );
        owned(QuantityVal(x.checked_sub(y).ok_or_else(|| overflow("sub"))?))
    })?;
    Ok(())
}

fn overflow(function: &str) -> ExecutionError {
    ExecutionError::function_error(function, "quantity out of the supported range")
}

// ---- Kubernetes semver library ---------------------------------------------------------------

/// kube's `normalizeAndParse`: drop a leading `v`, strip leading zeros of each of the first
/// three dot-separated parts, pad a short version with `.0`, then parse strictly.
pub(super) fn normalize_and_parse(input: &str) -> Result<semver::Version, String> {
    let input = input.strip_prefix('v').unwrap_or(input);
    let mut parts: Vec<String> = input.splitn(3, '.').map(str::to_owned).collect();
    for p in &mut parts {
        if p.len() > 1 {
            let trimmed = p.trim_start_matches('0');
            *p = if trimmed.starts_with(|c: char| c.is_ascii_digit()) {
                trimmed.to_owned()
            } else {
                format!("0{trimmed}")
            };
        }
    }
    if parts.len() < 3 {
        if parts.last().is_some_and(|p| p.contains(['+', '-'])) {
            return Err("short version cannot contain PreRelease/Build meta data".into());
        }
        while parts.len() < 3 {
            parts.push("0".into());
        }
    }
    parse_semver(&parts.join("."))
}

fn semver_of(input: &str, normalize: bool) -> Result<semver::Version, String> {
    if normalize {
        normalize_and_parse(input)
    } else {
        parse_semver(input)
    }
}

fn semver_lib(env: &mut Env) -> Result<(), DeclarationError> {
    let v = || SEMVER_TYPE.to_owned();
    env.add_overload("semver", "string_to_semver", vec![STRING_TYPE], |a| {
        let v = semver_of(s(&a, 0)?, false).map_err(|e| ExecutionError::function_error("semver", e))?;
        owned(SemverVal(v))
    })?;
    env.add_overload(
        "semver",
        "string_bool_to_semver",
        vec![STRING_TYPE, BOOL_TYPE],
        |a| {
            let v = semver_of(s(&a, 0)?, boolean(&a, 1)?)
                .map_err(|e| ExecutionError::function_error("semver", e))?;
            owned(SemverVal(v))
        },
    )?;
    env.add_overload("isSemver", "is_semver_string", vec![STRING_TYPE], |a| {
        owned(CelBool::from(semver_of(s(&a, 0)?, false).is_ok()))
    })?;
    env.add_overload(
        "isSemver",
        "is_semver_string_bool",
        vec![STRING_TYPE, BOOL_TYPE],
        |a| owned(CelBool::from(semver_of(s(&a, 0)?, boolean(&a, 1)?).is_ok())),
    )?;
    fn cmp(a: &[CowVal<'_, '_>]) -> Result<Ordering, ExecutionError> {
        Ok(arg::<SemverVal>(a, 0)?
            .0
            .cmp_precedence(&arg::<SemverVal>(a, 1)?.0))
    }
    env.add_member_overload("isGreaterThan", "semver_is_greater_than", v(), vec![v()], |a| {
        owned(CelBool::from(cmp(&a)? == Ordering::Greater))
    })?;
    env.add_member_overload("isLessThan", "semver_is_less_than", v(), vec![v()], |a| {
        owned(CelBool::from(cmp(&a)? == Ordering::Less))
    })?;
    env.add_member_overload("compareTo", "semver_compare_to", v(), vec![v()], |a| {
        owned(CelInt::from(ordering(cmp(&a)?)))
    })?;
    // Go converts the uint64 parts with `types.Int(v.Major)`, which wraps; so do we.
    env.add_member_overload("major", "semver_major", v(), vec![], |a| {
        owned(CelInt::from(arg::<SemverVal>(&a, 0)?.0.major as i64))
    })?;
    env.add_member_overload("minor", "semver_minor", v(), vec![], |a| {
        owned(CelInt::from(arg::<SemverVal>(&a, 0)?.0.minor as i64))
    })?;
    env.add_member_overload("patch", "semver_patch", v(), vec![], |a| {
        owned(CelInt::from(arg::<SemverVal>(&a, 0)?.0.patch as i64))
    })?;
    Ok(())
}

// ---- Kubernetes regex library ----------------------------------------------------------------

fn compile_regex(function: &str, pattern: &str) -> Result<regex::Regex, ExecutionError> {
    regex::RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .build()
        .map_err(|e| ExecutionError::function_error(function, e))
}

fn find_all<'b, 'v>(a: &[CowVal<'_, '_>], limit: i64) -> R<'b, 'v> {
    let re = compile_regex("findAll", s(a, 1)?)?;
    let text = s(a, 0)?;
    // Go's FindAllString: a negative limit means all matches.
    let take = usize::try_from(limit).unwrap_or(usize::MAX);
    let found: Vec<Box<dyn Val + 'v>> = re
        .find_iter(text)
        .take(take)
        .map(|m| Box::new(CelString::from(m.as_str().to_owned())) as Box<dyn Val + 'v>)
        .collect();
    owned(CelList::from(found))
}

fn regex_lib(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_member_overload(
        "find",
        "string_find_string",
        STRING_TYPE,
        vec![STRING_TYPE],
        |a| {
            let re = compile_regex("find", s(&a, 1)?)?;
            let found = re
                .find(s(&a, 0)?)
                .map(|m| m.as_str().to_owned())
                .unwrap_or_default();
            owned(CelString::from(found))
        },
    )?;
    env.add_member_overload(
        "findAll",
        "string_find_all_string",
        STRING_TYPE,
        vec![STRING_TYPE],
        |a| find_all(&a, -1),
    )?;
    env.add_member_overload(
        "findAll",
        "string_find_all_string_int",
        STRING_TYPE,
        vec![STRING_TYPE, INT_TYPE],
        |a| find_all(&a, int(&a, 2)?),
    )?;
    Ok(())
}

// ---- Kubernetes list library and ext.Lists v3 `first`/`last` --------------------------------

fn elements<'a, 'b, 'v>(
    a: &'a [CowVal<'b, 'v>],
    i: usize,
) -> Result<Vec<&'a (dyn Val + 'v)>, ExecutionError> {
    let list = a
        .get(i)
        .and_then(|v| v.as_ref().as_iterable())
        .ok_or_else(|| ExecutionError::InternalError(format!("argument {i} is not a list")))?;
    let mut it = list.iter();
    let mut out = Vec::new();
    while let Some(v) = it.next() {
        out.push(v);
    }
    Ok(out)
}

fn compare(function: &str, x: &dyn Val, y: &dyn Val) -> Result<Ordering, ExecutionError> {
    x.as_comparer()
        .ok_or_else(|| {
            ExecutionError::function_error(function, format!("{} is not comparable", x.get_type().name()))
        })?
        .compare(y)
}

fn extreme<'b, 'v>(a: &[CowVal<'b, 'v>], function: &str, want: Ordering) -> R<'b, 'v> {
    let items = elements(a, 0)?;
    let mut best: Option<&(dyn Val + 'v)> = None;
    for v in items {
        best = match best {
            Some(b) if compare(function, v, b)? != want => Some(b),
            _ => Some(v),
        };
    }
    match best {
        Some(b) => Ok(CowVal::Owned(b.clone_as_boxed())),
        None => Err(ExecutionError::function_error(function, "list is empty")),
    }
}

fn kube_lists(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_member_overload("isSorted", "list_is_sorted", LIST_TYPE, vec![], |a| {
        let items = elements(&a, 0)?;
        for w in items.windows(2) {
            if compare("isSorted", w[0], w[1])? == Ordering::Greater {
                return owned(CelBool::from(false));
            }
        }
        owned(CelBool::from(true))
    })?;
    env.add_member_overload("sum", "list_sum", LIST_TYPE, vec![], |a| {
        let items = elements(&a, 0)?;
        let mut total: Option<Box<dyn Val>> = None;
        for v in items {
            total = Some(match total {
                None => v.clone_as_boxed(),
                Some(t) => t
                    .as_adder()
                    .ok_or_else(|| ExecutionError::function_error("sum", "elements cannot be added"))?
                    .add(v)?
                    .into_owned(),
            });
        }
        // An empty list sums to int 0 (kube declares typed overloads; ints are the common case).
        Ok(CowVal::Owned(total.unwrap_or_else(|| Box::new(CelInt::from(0)))))
    })?;
    env.add_member_overload("min", "list_min", LIST_TYPE, vec![], |a| {
        extreme(&a, "min", Ordering::Less)
    })?;
    env.add_member_overload("max", "list_max", LIST_TYPE, vec![], |a| {
        extreme(&a, "max", Ordering::Greater)
    })?;
    env.add_member_overload(
        "indexOf",
        "list_index_of",
        LIST_TYPE,
        vec![cel::common::types::DYN_TYPE],
        |a| {
            let needle = a
                .get(1)
                .ok_or_else(|| ExecutionError::invalid_argument_count(2, a.len()))?;
            let pos = elements(&a, 0)?.iter().position(|v| v.equals(needle.as_ref()));
            owned(CelInt::from(pos.map_or(-1, |p| p as i64)))
        },
    )?;
    env.add_member_overload(
        "lastIndexOf",
        "list_last_index_of",
        LIST_TYPE,
        vec![cel::common::types::DYN_TYPE],
        |a| {
            let needle = a
                .get(1)
                .ok_or_else(|| ExecutionError::invalid_argument_count(2, a.len()))?;
            let pos = elements(&a, 0)?.iter().rposition(|v| v.equals(needle.as_ref()));
            owned(CelInt::from(pos.map_or(-1, |p| p as i64)))
        },
    )?;
    env.add_member_overload("first", "list_first", LIST_TYPE, vec![], |a| {
        let first = elements(&a, 0)?.first().map(|v| v.clone_as_boxed());
        owned(CelOptional::from(first))
    })?;
    env.add_member_overload("last", "list_last", LIST_TYPE, vec![], |a| {
        let last = elements(&a, 0)?.last().map(|v| v.clone_as_boxed());
        owned(CelOptional::from(last))
    })?;
    Ok(())
}

// ---- ext.Sets --------------------------------------------------------------------------------

fn contains_all(a: &[CowVal<'_, '_>], outer: usize, inner: usize) -> Result<bool, ExecutionError> {
    let haystack = elements(a, outer)?;
    Ok(elements(a, inner)?
        .iter()
        .all(|n| haystack.iter().any(|h| h.equals(*n))))
}

fn sets(env: &mut Env) -> Result<(), DeclarationError> {
    env.add_overload(
        "sets.contains",
        "list_sets_contains_list",
        vec![LIST_TYPE, LIST_TYPE],
        |a| owned(CelBool::from(contains_all(&a, 0, 1)?)),
    )?;
    env.add_overload(
        "sets.equivalent",
        "list_sets_equivalent_list",
        vec![LIST_TYPE, LIST_TYPE],
        |a| owned(CelBool::from(contains_all(&a, 0, 1)? && contains_all(&a, 1, 0)?)),
    )?;
    env.add_overload(
        "sets.intersects",
        "list_sets_intersects_list",
        vec![LIST_TYPE, LIST_TYPE],
        |a| {
            let x = elements(&a, 0)?;
            let hit = elements(&a, 1)?.iter().any(|n| x.iter().any(|h| h.equals(*n)));
            owned(CelBool::from(hit))
        },
    )?;
    Ok(())
}
