//! The overload table of the device-selector environment: every function by name and argument
//! types, as cel-go declares them. A table, not logic: the checker in [`super`] resolves calls
//! against it.

use super::Ty;

/// A function overload as the checker sees it; members list the receiver first.
pub(super) struct Sig {
    pub(super) name: &'static str,
    pub(super) member: bool,
    pub(super) params: &'static [Ty],
    pub(super) ret: Ty,
}

const fn g(name: &'static str, params: &'static [Ty], ret: Ty) -> Sig {
    Sig {
        name,
        member: false,
        params,
        ret,
    }
}

const fn m(name: &'static str, params: &'static [Ty], ret: Ty) -> Sig {
    Sig {
        name,
        member: true,
        params,
        ret,
    }
}

use super::Ty::{
    Bool as B, Bytes as Y, Cidr as C, Double as D, Duration as Du, Dyn as X, Int as I, Ip as P, List as L,
    Map as M, Optional as O, Quantity as Q, Semver as V, String as S, Timestamp as T, Uint as U,
};

/// Every function of the environment, by name and argument types (for the checker only: the
/// implementations are registered on the `cel` environment).
pub(super) static SIGNATURES: &[Sig] = &[
    // Standard library.
    g("size", &[S], I),
    g("size", &[Y], I),
    g("size", &[L], I),
    g("size", &[M], I),
    m("size", &[S], I),
    m("size", &[Y], I),
    m("size", &[L], I),
    m("size", &[M], I),
    g("int", &[X], I),
    g("uint", &[X], U),
    g("double", &[X], D),
    g("string", &[X], S),
    g("bool", &[X], B),
    g("bytes", &[X], Y),
    g("dyn", &[X], X),
    g("type", &[X], Ty::Type),
    g("duration", &[S], Du),
    g("timestamp", &[X], T),
    g("matches", &[S, S], B),
    m("matches", &[S, S], B),
    m("contains", &[S, S], B),
    m("startsWith", &[S, S], B),
    m("endsWith", &[S, S], B),
    m("getFullYear", &[X], I),
    m("getFullYear", &[X, S], I),
    m("getMonth", &[X], I),
    m("getMonth", &[X, S], I),
    m("getDayOfYear", &[X], I),
    m("getDayOfYear", &[X, S], I),
    m("getDayOfMonth", &[X], I),
    m("getDayOfMonth", &[X, S], I),
    m("getDate", &[X], I),
    m("getDate", &[X, S], I),
    m("getDayOfWeek", &[X], I),
    m("getDayOfWeek", &[X, S], I),
    m("getHours", &[X], I),
    m("getHours", &[X, S], I),
    m("getMinutes", &[X], I),
    m("getMinutes", &[X, S], I),
    m("getSeconds", &[X], I),
    m("getSeconds", &[X, S], I),
    m("getMilliseconds", &[X], I),
    m("getMilliseconds", &[X, S], I),
    // Optional types.
    g("optional.of", &[X], O),
    g("optional.ofNonZeroValue", &[X], O),
    g("optional.none", &[], O),
    m("hasValue", &[O], B),
    m("value", &[O], X),
    m("or", &[O, O], O),
    m("orValue", &[O, X], X),
    // ext.Strings.
    m("charAt", &[S, I], S),
    m("indexOf", &[S, S], I),
    m("indexOf", &[S, S, I], I),
    m("lastIndexOf", &[S, S], I),
    m("lastIndexOf", &[S, S, I], I),
    m("lowerAscii", &[S], S),
    m("upperAscii", &[S], S),
    m("trim", &[S], S),
    m("replace", &[S, S, S], S),
    m("replace", &[S, S, S, I], S),
    m("split", &[S, S], L),
    m("split", &[S, S, I], L),
    m("substring", &[S, I], S),
    m("substring", &[S, I, I], S),
    m("format", &[S, L], S),
    m("reverse", &[S], S),
    m("join", &[L], S),
    m("join", &[L, S], S),
    g("strings.quote", &[S], S),
    // ext.Lists.
    m("slice", &[L, I, I], L),
    m("flatten", &[L], L),
    m("flatten", &[L, I], L),
    m("distinct", &[L], L),
    m("reverse", &[L], L),
    m("sort", &[L], L),
    m("@sortByAssociatedKeys", &[L, L], L),
    m("first", &[L], O),
    m("last", &[L], O),
    g("lists.range", &[I], L),
    // Kubernetes lists.
    m("isSorted", &[L], B),
    m("sum", &[L], X),
    m("min", &[L], X),
    m("max", &[L], X),
    m("indexOf", &[L, X], I),
    m("lastIndexOf", &[L, X], I),
    // ext.Sets.
    g("sets.contains", &[L, L], B),
    g("sets.equivalent", &[L, L], B),
    g("sets.intersects", &[L, L], B),
    // Kubernetes regex.
    m("find", &[S, S], S),
    m("findAll", &[S, S], L),
    m("findAll", &[S, S, I], L),
    // Kubernetes quantity.
    g("quantity", &[S], Q),
    g("isQuantity", &[S], B),
    g("sign", &[Q], I),
    m("isGreaterThan", &[Q, Q], B),
    m("isLessThan", &[Q, Q], B),
    m("compareTo", &[Q, Q], I),
    m("asApproximateFloat", &[Q], D),
    m("asInteger", &[Q], I),
    m("isInteger", &[Q], B),
    m("add", &[Q, Q], Q),
    m("add", &[Q, I], Q),
    m("sub", &[Q, Q], Q),
    m("sub", &[Q, I], Q),
    // Kubernetes semver.
    g("semver", &[S], V),
    g("semver", &[S, B], V),
    g("isSemver", &[S], B),
    g("isSemver", &[S, B], B),
    m("isGreaterThan", &[V, V], B),
    m("isLessThan", &[V, V], B),
    m("compareTo", &[V, V], I),
    m("major", &[V], I),
    m("minor", &[V], I),
    m("patch", &[V], I),
    // Kubernetes IP and CIDR.
    g("ip", &[S], P),
    g("isIP", &[S], B),
    g("ip.isCanonical", &[S], B),
    m("family", &[P], I),
    m("isUnspecified", &[P], B),
    m("isLoopback", &[P], B),
    m("isLinkLocalMulticast", &[P], B),
    m("isLinkLocalUnicast", &[P], B),
    m("isGlobalUnicast", &[P], B),
    g("cidr", &[S], C),
    g("isCIDR", &[S], B),
    m("containsIP", &[C, P], B),
    m("containsIP", &[C, S], B),
    m("containsCIDR", &[C, C], B),
    m("containsCIDR", &[C, S], B),
    m("ip", &[C], P),
    m("masked", &[C], C),
    m("prefixLength", &[C], I),
    // Helpers of the two-variable comprehensions (not callable from CEL source).
    g("@pairs", &[X], L),
    g("@toMap", &[L], M),
    g("@mergeMaps", &[L], M),
];
