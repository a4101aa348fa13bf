//! cel-go's two-variable comprehensions (`ext.TwoVarComprehensions`): `all`, `exists`,
//! `existsOne`, `transformList`, `transformMap` and `transformMapEntry` with an index (list) or
//! key (map) variable and a value variable.
//!
//! The crate's interpreter binds one variable per comprehension, so each macro iterates
//! `@pairs(target)`, the `[index or key, value]` pairs of the list or map, and binds both
//! variables from the pair, as `cel.bind` does.

use cel::common::ast::{CallExpr, ComprehensionExpr, Expr, IdedExpr, ListExpr, LiteralValue};
use cel::common::types::{CelInt, CelList, CelMap, CelMapKey, DYN_TYPE, Kind as TypeKind, LIST_TYPE};
use cel::common::value::{CowVal, Val};
use cel::parser::{Macro, MacroExprHelper, ParseError};
use cel::{DeclarationError, Env, ExecutionError};

/// The iteration variable holding one `[first, second]` pair; not writable in CEL.
const PAIR: &str = "@pair";
const RESULT: &str = "@result";
pub(super) const PAIRS_FN: &str = "@pairs";
pub(super) const TO_MAP_FN: &str = "@toMap";
pub(super) const MERGE_FN: &str = "@mergeMaps";

#[derive(Clone, Copy)]
enum Kind {
    All,
    Exists,
    ExistsOne,
    TransformList,
    TransformMap,
    TransformMapEntry,
}

pub(super) fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let macros = [
        ("all", 3, Kind::All),
        ("exists", 3, Kind::Exists),
        ("existsOne", 3, Kind::ExistsOne),
        ("transformList", 3, Kind::TransformList),
        ("transformList", 4, Kind::TransformList),
        ("transformMap", 3, Kind::TransformMap),
        ("transformMap", 4, Kind::TransformMap),
        ("transformMapEntry", 3, Kind::TransformMapEntry),
        ("transformMapEntry", 4, Kind::TransformMapEntry),
    ];
    for (name, arity, kind) in macros {
        env.add_macro(Macro::receiver(name, arity, move |h, t, a| expand(kind, h, t, a)))?;
    }
    env.add_overload(PAIRS_FN, "@pairs_dyn", vec![DYN_TYPE], pairs)?;
    env.add_overload(TO_MAP_FN, "@to_map_list", vec![LIST_TYPE], to_map)?;
    env.add_overload(MERGE_FN, "@merge_maps_list", vec![LIST_TYPE], merge_maps)?;
    Ok(())
}

fn ident(h: &mut MacroExprHelper<'_>, name: &str) -> IdedExpr {
    h.next_expr(Expr::Ident(name.to_owned()))
}

fn call(h: &mut MacroExprHelper<'_>, name: &str, args: Vec<IdedExpr>) -> IdedExpr {
    h.next_expr(Expr::Call(CallExpr {
        func_name: name.to_owned(),
        target: None,
        args,
    }))
}

fn literal(h: &mut MacroExprHelper<'_>, v: LiteralValue) -> IdedExpr {
    h.next_expr(Expr::Literal(v))
}

/// `cel.bind(name, init, body)`.
fn bind(h: &mut MacroExprHelper<'_>, name: String, init: IdedExpr, body: IdedExpr) -> IdedExpr {
    let range = h.next_expr(Expr::List(ListExpr::new(Vec::new())));
    let cond = literal(h, LiteralValue::Boolean(false.into()));
    let step = ident(h, &name);
    h.next_expr(Expr::Comprehension(Box::new(ComprehensionExpr {
        iter_range: range,
        iter_var: "#unused".to_owned(),
        iter_var2: None,
        accu_var: name,
        accu_init: init,
        loop_cond: cond,
        loop_step: step,
        result: body,
    })))
}

/// `body` with `first` and `second` bound to `@pair[0]` and `@pair[1]`.
fn with_pair(h: &mut MacroExprHelper<'_>, first: &str, second: &str, body: IdedExpr) -> IdedExpr {
    let element = |h: &mut MacroExprHelper<'_>, i: i64| {
        let pair = ident(h, PAIR);
        let index = literal(h, LiteralValue::Int(CelInt::from(i)));
        call(h, "_[_]", vec![pair, index])
    };
    let second_init = element(h, 1);
    let inner = bind(h, second.to_owned(), second_init, body);
    let first_init = element(h, 0);
    bind(h, first.to_owned(), first_init, inner)
}

fn var_name(h: &MacroExprHelper<'_>, e: &IdedExpr) -> Result<String, ParseError> {
    match &e.expr {
        Expr::Ident(name) => Ok(name.clone()),
        _ => Err(h.new_error(e.id, "argument must be a simple name")),
    }
}

fn expand(
    kind: Kind,
    h: &mut MacroExprHelper<'_>,
    target: &mut Option<IdedExpr>,
    args: &mut Vec<IdedExpr>,
) -> Result<Option<IdedExpr>, ParseError> {
    let Some(range) = target.take() else {
        return Ok(None);
    };
    let mut taken = std::mem::take(args).into_iter();
    let (Some(first), Some(second)) = (taken.next(), taken.next()) else {
        return Err(h.new_error(range.id, "expected two variable names"));
    };
    let rest: Vec<IdedExpr> = taken.collect();
    let (first, second) = (var_name(h, &first)?, var_name(h, &second)?);
    if first == second {
        return Err(h.new_error(range.id, "duplicate variable name"));
    }
    let mut rest: Vec<IdedExpr> = rest
        .into_iter()
        .map(|e| with_pair(h, &first, &second, e))
        .collect();
    let (Some(last), filter) = (rest.pop(), rest.pop()) else {
        return Err(h.new_error(range.id, "missing expression"));
    };
    let iter_range = call(h, PAIRS_FN, vec![range]);
    let accu = |h: &mut MacroExprHelper<'_>| ident(h, RESULT);
    let (init, cond, step, result) = match kind {
        Kind::All | Kind::Exists => {
            let all = matches!(kind, Kind::All);
            let init = literal(h, LiteralValue::Boolean(all.into()));
            let a = accu(h);
            let a = if all { a } else { call(h, "!_", vec![a]) };
            let cond = call(h, "@not_strictly_false", vec![a]);
            let a = accu(h);
            let step = call(h, if all { "_&&_" } else { "_||_" }, vec![a, last]);
            (init, cond, step, accu(h))
        }
        Kind::ExistsOne => {
            let init = literal(h, LiteralValue::Int(CelInt::from(0)));
            let cond = literal(h, LiteralValue::Boolean(true.into()));
            let (a1, a2) = (accu(h), accu(h));
            let one = literal(h, LiteralValue::Int(CelInt::from(1)));
            let plus = call(h, "_+_", vec![a1, one]);
            let step = call(h, "_?_:_", vec![last, plus, a2]);
            let a = accu(h);
            let one = literal(h, LiteralValue::Int(CelInt::from(1)));
            (init, cond, step, call(h, "_==_", vec![a, one]))
        }
        Kind::TransformList | Kind::TransformMap | Kind::TransformMapEntry => {
            let init = h.next_expr(Expr::List(ListExpr::new(Vec::new())));
            let cond = literal(h, LiteralValue::Boolean(true.into()));
            // TransformMap collects [key, value] pairs, TransformMapEntry the entry maps.
            let item = match kind {
                Kind::TransformMap => {
                    let key = ident(h, &first);
                    let key = with_pair(h, &first, &second, key);
                    h.next_expr(Expr::List(ListExpr::new(vec![key, last])))
                }
                _ => last,
            };
            let wrapped = h.next_expr(Expr::List(ListExpr::new(vec![item])));
            let a = accu(h);
            let appended = call(h, "_+_", vec![a, wrapped]);
            let step = match filter {
                Some(f) => {
                    let a = accu(h);
                    call(h, "_?_:_", vec![f, appended, a])
                }
                None => appended,
            };
            let a = accu(h);
            let result = match kind {
                Kind::TransformMap => call(h, TO_MAP_FN, vec![a]),
                Kind::TransformMapEntry => call(h, MERGE_FN, vec![a]),
                _ => a,
            };
            (init, cond, step, result)
        }
    };
    Ok(Some(h.next_expr(Expr::Comprehension(Box::new(
        ComprehensionExpr {
            iter_range,
            iter_var: PAIR.to_owned(),
            iter_var2: None,
            accu_var: RESULT.to_owned(),
            accu_init: init,
            loop_cond: cond,
            loop_step: step,
            result,
        },
    )))))
}

/// `[[index, value], ...]` of a list, `[[key, value], ...]` of a map.
fn pairs<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let target = args
        .first()
        .ok_or_else(|| ExecutionError::invalid_argument_count(1, 0))?;
    let is_list = target.get_type().kind() == TypeKind::List;
    let iterable = target.as_ref().as_iterable().ok_or_else(|| {
        ExecutionError::function_error(
            "comprehension",
            format!("cannot iterate over {}", target.get_type().name()),
        )
    })?;
    let indexer = target.as_ref().as_indexer();
    let mut out: Vec<Box<dyn Val + 'v>> = Vec::new();
    let mut it = iterable.iter();
    let mut index: i64 = 0;
    while let Some(item) = it.next() {
        let (first, second): (Box<dyn Val + 'v>, Box<dyn Val + 'v>) = if is_list {
            (Box::new(CelInt::from(index)), item.clone_as_boxed())
        } else {
            let value = indexer
                .ok_or_else(|| ExecutionError::function_error("comprehension", "map without values"))?
                .get(item)?
                .into_owned();
            (item.clone_as_boxed(), value)
        };
        out.push(Box::new(CelList::from(vec![first, second])));
        index = index.saturating_add(1);
    }
    Ok(CowVal::owned(CelList::from(out)))
}

fn insert<'v>(
    map: &mut std::collections::HashMap<CelMapKey<'v>, Box<dyn Val + 'v>>,
    key: &(dyn Val + 'v),
    value: Box<dyn Val + 'v>,
) -> Result<(), ExecutionError> {
    let key: CelMapKey<'v> = key.clone_as_boxed().try_into()?;
    if map.contains_key(&key) {
        return Err(ExecutionError::function_error(
            "transformMapEntry",
            "insert failed: key already exists",
        ));
    }
    map.insert(key, value);
    Ok(())
}

/// `[[k, v], ...]` to `{k: v, ...}`.
fn to_map<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let list = args
        .first()
        .and_then(|l| l.as_ref().as_iterable())
        .ok_or_else(|| ExecutionError::invalid_argument_count(1, 0))?;
    let mut map = std::collections::HashMap::new();
    let mut it = list.iter();
    while let Some(pair) = it.next() {
        let idx = pair
            .as_indexer()
            .ok_or_else(|| ExecutionError::InternalError("transformMap pair".into()))?;
        let key = idx.get(&CelInt::from(0))?;
        let value = idx.get(&CelInt::from(1))?.into_owned();
        let key: CelMapKey<'v> = key.into_owned().try_into()?;
        map.insert(key, value);
    }
    Ok(CowVal::owned(CelMap::from(map)))
}

/// `[{k: v}, ...]` to one map; a repeated key is an error, as in cel-go.
fn merge_maps<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>, ExecutionError> {
    let list = args
        .first()
        .and_then(|l| l.as_ref().as_iterable())
        .ok_or_else(|| ExecutionError::invalid_argument_count(1, 0))?;
    let mut map = std::collections::HashMap::new();
    let mut it = list.iter();
    while let Some(entry) = it.next() {
        let (Some(keys), Some(idx)) = (entry.as_iterable(), entry.as_indexer()) else {
            return Err(ExecutionError::function_error(
                "transformMapEntry",
                format!("expression must be a map, not {}", entry.get_type().name()),
            ));
        };
        let mut k = keys.iter();
        while let Some(key) = k.next() {
            let value = idx.get(key)?.into_owned();
            insert(&mut map, key, value)?;
        }
    }
    Ok(CowVal::owned(CelMap::from(map)))
}
