//! Tests of the CEL device selectors: the interpreter's own cases and the upstream vectors.
//! Size (~720 lines of code): one file, because every case builds its devices with the same
//! few fixtures at the top (`Fixture`, the attribute and capacity makers, `eval`); split it with
//! those fixtures into a module of their own when it grows.

use std::collections::BTreeMap;
use std::path::PathBuf;

use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};

use crate::dra::slice::{Device, DeviceMap};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use serde_json::Value as Json;

use super::*;

// ---- helpers --------------------------------------------------------------------------------

fn attr_int(i: i64) -> DeviceAttribute {
    DeviceAttribute {
        int: Some(i),
        ..Default::default()
    }
}
fn attr_bool(b: bool) -> DeviceAttribute {
    DeviceAttribute {
        bool: Some(b),
        ..Default::default()
    }
}
fn attr_str(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        string: Some(s.into()),
        ..Default::default()
    }
}
fn attr_version(s: &str) -> DeviceAttribute {
    DeviceAttribute {
        version: Some(s.into()),
        ..Default::default()
    }
}
fn cap(q: &str) -> DeviceCapacity {
    DeviceCapacity {
        value: K8sQuantity(q.into()),
        ..Default::default()
    }
}

/// A GPU-like device of driver `gpu.example.com`.
struct Fixture {
    attributes: DeviceMap<DeviceAttribute>,
    capacity: DeviceMap<DeviceCapacity>,
}

impl Fixture {
    fn new() -> Self {
        let attributes = DeviceMap::from_iter([
            ("model".to_owned(), attr_str("A100")),
            ("numa".to_owned(), attr_int(1)),
            ("mig".to_owned(), attr_bool(false)),
            ("driverVersion".to_owned(), attr_version("1.2.3-rc.1+build5")),
            ("other.com/color".to_owned(), attr_str("blue")),
            ("cidr".to_owned(), attr_str("10.1.0.0/16")),
        ]);
        let capacity = DeviceMap::from_iter([
            ("memory".to_owned(), cap("40Gi")),
            ("other.com/slots".to_owned(), cap("1500m")),
        ]);
        Fixture { attributes, capacity }
    }

    fn view(&self) -> DeviceView<'_> {
        DeviceView {
            driver: "gpu.example.com",
            id: "gpu.example.com/pool/gpu-0",
            attributes: Some(&self.attributes),
            capacity: Some(&self.capacity),
            allow_multiple_allocations: Some(true),
        }
    }
}

#[track_caller]
fn eval(expr: &str) -> Result<bool, CelError> {
    let f = Fixture::new();
    Selector::compile(expr).and_then(|s| s.matches(&f.view()))
}

#[track_caller]
fn yes(expr: &str) {
    assert_eq!(eval(expr), Ok(true), "{expr}");
}

#[track_caller]
fn no(expr: &str) {
    assert_eq!(eval(expr), Ok(false), "{expr}");
}

/// Compile fails, with a reason containing `needle`.
#[track_caller]
fn compile_err(expr: &str, needle: &str) {
    match Selector::compile(expr) {
        Err(CelError::Compile { reason, expression }) => {
            assert_eq!(expression, expr);
            assert!(reason.contains(needle), "{expr}: {reason:?} lacks {needle:?}");
        }
        other => panic!("{expr}: expected a compile error, got {other:?}"),
    }
}

/// Compiles, then fails on the fixture device, with a reason containing `needle`.
#[track_caller]
fn eval_err(expr: &str, needle: &str) {
    match eval(expr) {
        Err(CelError::Evaluate { reason, device, .. }) => {
            assert_eq!(device, "gpu.example.com/pool/gpu-0");
            assert!(reason.contains(needle), "{expr}: {reason:?} lacks {needle:?}");
        }
        other => panic!("{expr}: expected an evaluation error, got {other:?}"),
    }
}

// ---- the device variable and the domain rules -----------------------------------------------

#[test]
fn device_fields() {
    yes(r#"device.driver == "gpu.example.com""#);
    no(r#"device.driver == "nic.example.com""#);
    yes("device.allowMultipleAllocations");
    yes("device.allowMultipleAllocations == true");
    compile_err("device.name == 'x'", "undefined field 'name'");
}

#[test]
fn allow_multiple_allocations_defaults_to_false() {
    let f = Fixture::new();
    let view = DeviceView {
        allow_multiple_allocations: None,
        ..f.view()
    };
    let s = Selector::compile("device.allowMultipleAllocations == false").expect("compiles");
    assert_eq!(s.matches(&view), Ok(true));
}

#[test]
fn unqualified_names_land_in_the_driver_domain() {
    yes(r#"device.attributes["gpu.example.com"].model == "A100""#);
    yes(r#"device.attributes["gpu.example.com"].numa == 1"#);
    yes(r#"!device.attributes["gpu.example.com"].mig"#);
    yes(r#"device.attributes["other.com"].color == "blue""#);
    yes(r#"!("color" in device.attributes["gpu.example.com"])"#);
    yes(r#"device.capacity["gpu.example.com"].memory == quantity("40Gi")"#);
    yes(r#"device.capacity["other.com"].slots.compareTo(quantity("1.5")) == 0"#);
    yes(r#"size(device.attributes) == 2 && size(device.attributes["gpu.example.com"]) == 5"#);
    yes(r#""other.com" in device.attributes && !("nope.com" in device.attributes)"#);
}

#[test]
fn unknown_domain_is_an_empty_map() {
    no(r#""x" in device.attributes["unknown.com"]"#);
    yes(r#"size(device.attributes["unknown.com"]) == 0"#);
    yes(r#"size(device.capacity["unknown.com"]) == 0"#);
    eval_err(r#"device.attributes["unknown.com"].x == 1"#, "no such key: x");
    eval_err(
        r#"device.attributes["gpu.example.com"].nope"#,
        "no such key: nope",
    );
    yes(r#"!has(device.attributes["gpu.example.com"].nope)"#);
    yes(r#"has(device.attributes["gpu.example.com"].model)"#);
    // cel-go's `Find` on the defaulting map always finds: has() of a domain is true.
    yes(r#"has(device.attributes.anything)"#);
}

#[test]
fn attribute_values_have_their_types() {
    yes(r#"type(device.attributes["gpu.example.com"].numa) == int"#);
    yes(r#"type(device.attributes["gpu.example.com"].model) == string"#);
    yes(r#"type(device.attributes["gpu.example.com"].mig) == bool"#);
    yes(r#"device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.2.2"))"#);
    yes(r#"device.attributes["gpu.example.com"].driverVersion.isLessThan(semver("1.2.3"))"#);
    yes(r#"device.attributes["gpu.example.com"].driverVersion == semver("1.2.3-rc.1")"#);
    // Run-time equality across types is false, ordering across types an error (cel-go).
    no(r#"device.attributes["gpu.example.com"].numa == "1""#);
    eval_err(
        r#"device.attributes["gpu.example.com"].numa < "1""#,
        "no matching overload",
    );
}

#[test]
fn bad_attributes_fail_every_selector_as_in_kube() {
    let attributes = DeviceMap::from_iter([("broken".to_owned(), DeviceAttribute::default())]);
    let view = DeviceView {
        driver: "d",
        id: "d/p/x",
        attributes: Some(&attributes),
        capacity: None,
        allow_multiple_allocations: None,
    };
    let s = Selector::compile(r#"device.driver == "d""#).expect("compiles");
    match s.matches(&view) {
        Err(CelError::Evaluate { reason, .. }) => {
            assert_eq!(reason, "attribute broken: unsupported attribute value")
        }
        other => panic!("{other:?}"),
    }
    let attributes = DeviceMap::from_iter([("v".to_owned(), attr_version("01.2.3"))]);
    let view = DeviceView {
        attributes: Some(&attributes),
        ..view
    };
    assert!(
        matches!(s.matches(&view), Err(CelError::Evaluate { reason, .. }) if reason.contains("attribute v: parse semantic version"))
    );
}

#[test]
fn bind() {
    yes(r#"cel.bind(dra, device.attributes["gpu.example.com"], dra.model == "A100" && dra.numa == 1)"#);
    yes(r#"cel.bind(x, 2, cel.bind(y, x * 3, y == 6))"#);
    compile_err("cel.bind(x, 1, y)", "undeclared reference to 'y'");
}

// ---- compile errors ---------------------------------------------------------------------------

#[test]
fn compile_errors_name_the_problem_as_kube_does() {
    // The exact text the upstream allocator reports (dra_allocator_cases.json).
    let Err(CelError::Compile { reason, .. }) = Selector::compile("noSuchVar") else {
        panic!("noSuchVar compiled");
    };
    assert_eq!(
        reason,
        "compilation failed: ERROR: <input>:1:1: undeclared reference to 'noSuchVar' (in container '')\n | noSuchVar\n | ^"
    );
    compile_err("device.driver ==", "compilation failed: ERROR: <input>:1:");
    compile_err("noSuchFunction(1)", "undeclared reference to 'noSuchFunction'");
    compile_err(
        "device.driver.noSuchMethod()",
        "undeclared reference to 'noSuchMethod'",
    );
    compile_err("1 + 1", "must evaluate to bool or the unknown type, not int");
    compile_err(
        "device.driver",
        "must evaluate to bool or the unknown type, not string",
    );
    compile_err(r#"quantity("1")"#, "not kubernetes.Quantity");
    compile_err(
        r#"device.driver == 1"#,
        "found no matching overload for '_==_' applied to '(string, int)'",
    );
    compile_err(
        r#"device.driver + 1 == "x""#,
        "found no matching overload for '_+_'",
    );
    compile_err(
        "quantity(1).sign() == 1",
        "found no matching overload for 'quantity' applied to '(int)'",
    );
    compile_err(
        r#"quantity("1").compareTo(semver("1.0.0")) == 0"#,
        "found no matching overload for 'compareTo' applied to 'kubernetes.Quantity.(kubernetes.Semver)'",
    );
    compile_err(
        r#"quantity("1") < quantity("2")"#,
        "found no matching overload for '_<_'",
    );
    compile_err("1.all(x, x)", "cannot be range of a comprehension");
    compile_err("device.driver.x", "does not support field selection");
    compile_err("device['driver'] == 'x'", "no matching overload for '_[_]'");
}

#[test]
fn a_dynamic_result_is_checked_at_run_time() {
    // kube accepts a `dyn` result at compile time and converts at evaluation.
    eval_err(
        r#"device.attributes["gpu.example.com"].numa"#,
        "CEL result of type int could not be converted to bool",
    );
    yes(r#"device.attributes["gpu.example.com"].mig || true"#);
}

#[test]
fn odd_inputs_give_errors_not_panics() {
    let odd = [
        "",
        " ",
        "(",
        ")",
        "[[[",
        "}",
        "device.",
        ".device",
        "device..driver",
        "'unterminated",
        "\"\\u00\"",
        "b'\\xff' == b'\\xff'",
        "1 ? 2 : 3",
        "{1: 2, 1: 3}.size() == 1",
        "{}.all(k, k)",
        "[1, 2][5] == 1",
        "[1][-1] == 1",
        "1 / 0 == 1",
        "1 % 0 == 1",
        "9223372036854775807 + 1 > 0",
        "-9223372036854775808 - 1 < 0",
        "-(-9223372036854775808) > 0",
        "int('x') == 1",
        "int(1e300) == 1",
        "uint(-1) == 1u",
        "'abc'.substring(5) == ''",
        "'abc'.charAt(10) == ''",
        "'abc'.matches('(') ",
        "'abc'.find('[') == ''",
        "lists.range(-1).size() == 0",
        "[].sum() == 0",
        "[].min() == 0",
        "['a', 1].max() == 1",
        "[1, 'a'].sort() == []",
        "duration('x') > duration('1s')",
        "timestamp('x') > timestamp(0)",
        "semver('x').major() == 1",
        "quantity('x').sign() == 1",
        "quantity('1e1000').sign() == 1",
        "quantity('9Ei').add(quantity('9Ei')).isInteger()",
        "ip('1.2.3.4%eth0').family() == 4",
        "cidr('1.2.3.4/33').prefixLength() == 33",
        "optional.none().value() == 1",
        "[?optional.none()] == []",
        "{?'a': optional.none()} == {}",
        "dyn(1) == dyn('1')",
        "type(device) == type(1)",
        "device == device",
        "[device][0].driver == 'x'",
        "has(device.driver)",
        "has(device.nope)",
        "x.y.z",
        "a.b(c)",
        "google.protobuf.Int32Value{value: 1}",
        "Foo{}",
        "cel.bind(1, 2, 3)",
        "cel.bind(x)",
        "cel.other(x, 1, true)",
        "'\u{10FFFF}' + '\u{0}' == ''",
        "\u{0}",
        "[1,2,3].map(x, x, x, x)",
        "[1].exists(1, true)",
        "1 in 1",
        "'a' in {'a': 1}",
        "!!!!!!true",
        "------1 == 1",
        "1 == 1 == true",
        "device.attributes[1].x == 1",
        "device.attributes['gpu.example.com'][1] == 1",
        "device.capacity['gpu.example.com'].memory.asInteger() > 0",
        "device.capacity['other.com'].slots.asInteger() > 0",
    ];
    for expr in odd {
        // Either outcome is fine; a panic (or an abort) is not.
        let _ = eval(expr);
    }
    // Deep nesting is refused before anything recurses.
    let deep = format!("{}true{}", "(".repeat(5000), ")".repeat(5000));
    compile_err(&deep, "nested more than");
    let deep = format!("{}1{}", "[".repeat(300), "]".repeat(300));
    compile_err(&deep, "nested more than");
    // Long chains, within the API server's 10 KiB: parsed on the compiler's own stack, then
    // refused by the depth limit or evaluated (`&&` chains are balanced, `!!` pairs folded).
    let chain = vec!["true"; 1200].join(" && ");
    assert_eq!(eval(&chain), Ok(true));
    assert_eq!(eval(&format!("{}true", "!".repeat(10_000))), Ok(true));
    compile_err(
        &format!("device{}", ".driver".repeat(1400)),
        "nested more than 32",
    );
    compile_err(&format!("[1]{}", "[0]".repeat(3000)), "nested more than 32");
    compile_err(
        &format!("{} > 0", vec!["1"; 3000].join("+")),
        "nested more than 32",
    );
    compile_err(
        &format!("{}true{}", "[1].all(x, ".repeat(240), ")".repeat(240)),
        "compilation failed",
    );
    compile_err(&"x".repeat(MAX_EXPRESSION_LEN + 1), "longer than 10240 bytes");
    // Just within the depth limit, evaluation fits a test thread's stack.
    let deep = format!(
        "{}true{}{} == true",
        "[".repeat(14),
        "]".repeat(14),
        "[0]".repeat(14)
    );
    assert_eq!(eval(&deep), Ok(true));
}

// ---- cost -------------------------------------------------------------------------------------

#[test]
fn cost_limit() {
    // Bounded by kube's declared sizes: 32 domains x 32 attributes.
    let nested = r#"device.attributes.all(d, device.attributes[d].all(k, k != ""))"#;
    let s = Selector::compile(nested).expect("within the limit");
    assert!(
        s.estimated_cost() > 1000 && s.estimated_cost() <= COST_LIMIT,
        "{}",
        s.estimated_cost()
    );
    yes(nested);
    // A range of unknown size cannot be bounded: rejected, as kube's estimator rejects it.
    let unknown = r#"lists.range(device.attributes["gpu.example.com"].numa).all(i, i >= 0)"#;
    assert_eq!(
        Selector::compile(unknown).map(|_| ()),
        Err(CelError::CostLimit {
            expression: unknown.to_owned()
        })
    );
    // Known but too large.
    let big = "lists.range(1000).all(i, lists.range(1000).all(j, lists.range(10).all(k, i + j + k >= 0)))";
    assert!(matches!(Selector::compile(big), Err(CelError::CostLimit { .. })));
    // Just below: 1000 x 100 iterations.
    let ok = "lists.range(1000).all(i, lists.range(100).all(j, i + j >= 0))";
    let s = Selector::compile(ok).expect("within the limit");
    assert!(s.estimated_cost() <= COST_LIMIT);
    yes(ok);
    // Literal sizes count.
    let lit = "[1, 2, 3].map(x, x * 2).all(y, y > 0)";
    assert!(Selector::compile(lit).expect("compiles").estimated_cost() < 100);
    yes(lit);
    // A bound comprehension's body is counted once.
    let b = r#"cel.bind(xs, [1, 2, 3], xs.exists(x, x == 2))"#;
    assert!(Selector::compile(b).expect("compiles").estimated_cost() < 100);
    yes(b);
}

// ---- quantity library ---------------------------------------------------------------------

#[test]
fn quantity_library() {
    yes(r#"isQuantity("1.5Gi") && !isQuantity("1.5Gix") && !isQuantity("")"#);
    yes(r#"quantity("1Ki") == quantity("1024")"#);
    yes(r#"quantity("1Ki") != quantity("1000")"#);
    yes(r#"sign(quantity("-1m")) == -1 && sign(quantity("0")) == 0 && sign(quantity("3")) == 1"#);
    yes(r#"quantity("2Gi").isGreaterThan(quantity("1Gi"))"#);
    yes(r#"quantity("1Gi").isLessThan(quantity("2Gi"))"#);
    yes(r#"!quantity("1Gi").isLessThan(quantity("1024Mi"))"#);
    yes(r#"quantity("1Gi").compareTo(quantity("1024Mi")) == 0"#);
    yes(r#"quantity("1").compareTo(quantity("2")) == -1 && quantity("2").compareTo(quantity("1")) == 1"#);
    yes(r#"quantity("1.5").asApproximateFloat() == 1.5"#);
    yes(r#"quantity("1Ki").asInteger() == 1024"#);
    yes(r#"quantity("1Ki").isInteger() && !quantity("1500m").isInteger()"#);
    yes(r#"!quantity("100E").isInteger() && quantity("100Ei").isInteger()"#);
    yes(r#"quantity("1Gi").add(quantity("1Gi")) == quantity("2Gi")"#);
    yes(r#"quantity("1Gi").add(1) == quantity("1073741825")"#);
    yes(r#"quantity("1Gi").sub(quantity("512Mi")) == quantity("512Mi")"#);
    yes(r#"quantity("1").sub(2) == quantity("-1")"#);
    eval_err(
        r#"quantity("1500m").asInteger() == 1"#,
        "cannot convert value to integer",
    );
    eval_err(r#"quantity("abc").isInteger()"#, "quantity");
}

// ---- semver library -----------------------------------------------------------------------

#[test]
fn semver_library() {
    yes(r#"isSemver("1.2.3") && isSemver("1.2.3-alpha.1+b.5") && !isSemver("1.2") && !isSemver("v1.2.3")"#);
    yes(r#"!isSemver("01.2.3") && !isSemver("1.2.3-01") && !isSemver("1.2.3-") && !isSemver("")"#);
    yes(r#"isSemver("v1.2", true) && isSemver("01.02.03", true) && !isSemver("1.2-rc", true)"#);
    yes(r#"semver("v1", true) == semver("1.0.0") && semver("01.01.01", true) == semver("1.1.1")"#);
    yes(r#"semver("1.2.3").major() == 1 && semver("1.2.3").minor() == 2 && semver("1.2.3").patch() == 3"#);
    yes(r#"semver("1.2.3").isGreaterThan(semver("1.2.3-rc.1"))"#);
    yes(r#"semver("1.2.3-alpha").isLessThan(semver("1.2.3-alpha.1"))"#);
    yes(r#"semver("1.2.3-alpha.2").isLessThan(semver("1.2.3-alpha.10"))"#);
    yes(r#"semver("1.2.3-2").isLessThan(semver("1.2.3-alpha"))"#);
    yes(r#"semver("1.2.3+a").compareTo(semver("1.2.3+b")) == 0 && semver("1.2.3+a") == semver("1.2.3+b")"#);
    yes(r#"semver("2.0.0").compareTo(semver("10.0.0")) == -1"#);
    eval_err(r#"semver("1.2").major() == 1"#, "semver");
}

#[test]
fn normalize_matches_kube() {
    use super::library::normalize_and_parse;
    let ok = |s: &str, want: &str| {
        assert_eq!(
            normalize_and_parse(s).map(|v| v.to_string()),
            Ok(want.to_owned()),
            "{s}"
        )
    };
    ok("v1.2.3", "1.2.3");
    ok("1", "1.0.0");
    ok("1.2", "1.2.0");
    ok("00.000.0", "0.0.0");
    ok("1.2.03-rc.1", "1.2.3-rc.1");
    assert!(normalize_and_parse("1-rc").is_err());
    assert!(normalize_and_parse("vv1.2.3").is_err());
    assert!(normalize_and_parse("1.2.x").is_err());
}

// ---- strings, lists, sets, regex, optionals ------------------------------------------------

#[test]
fn strings_extension() {
    yes(
        r#"device.driver.startsWith("gpu.") && device.driver.endsWith(".com") && device.driver.contains("example")"#,
    );
    yes(r#"device.driver.matches("^gpu\\.[a-z]+\\.com$")"#);
    yes(r#"device.driver.split(".") == ["gpu", "example", "com"]"#);
    yes(r#"device.driver.indexOf(".") == 3 && device.driver.lastIndexOf(".") == 11"#);
    yes(r#"device.driver.substring(0, 3).upperAscii() == "GPU""#);
    yes(r#""  x ".trim() == "x" && "a-b".replace("-", "+") == "a+b" && "abc".charAt(1) == "b""#);
    yes(r#"["a", "b"].join(",") == "a,b" && "%s-%d".format(["x", 1]) == "x-1""#);
    yes(r#"strings.quote("a\"b") == "\"a\\\"b\"""#);
    yes(r#"size(device.driver) == 15 && device.driver.size() == 15"#);
}

#[test]
fn lists_and_sets() {
    yes("[3, 1, 2].sort() == [1, 2, 3] && [1, 1, 2].distinct() == [1, 2] && [1, 2].reverse() == [2, 1]");
    yes("[[1], [2, 3]].flatten() == [1, 2, 3] && [1, 2, 3, 4].slice(1, 3) == [2, 3]");
    yes("lists.range(3) == [0, 1, 2]");
    yes("[1, 2, 3].first() == optional.of(1) && [1, 2, 3].last().value() == 3 && ![].first().hasValue()");
    yes("[1, 2, 3].isSorted() && ![2, 1].isSorted()");
    yes("[1, 2, 3].sum() == 6 && [1.5, 2.5].sum() == 4.0 && [].sum() == 0");
    yes("[3, 1, 2].min() == 1 && [3, 1, 2].max() == 3");
    yes("[1, 2, 1].indexOf(1) == 0 && [1, 2, 1].lastIndexOf(1) == 2 && [1].indexOf(5) == -1");
    yes(r#"["b", "a"].sortBy(x, x) == ["a", "b"]"#);
    yes("sets.contains([1, 2, 3], [3, 1]) && !sets.contains([1], [2])");
    yes("sets.equivalent([1, 2, 2], [2, 1]) && !sets.equivalent([1], [1, 2])");
    yes("sets.intersects([1, 2], [2, 3]) && !sets.intersects([1], [2])");
    yes("[1, 2, 3].exists(x, x == 2) && [1, 2, 3].all(x, x > 0) && [1, 2, 3].exists_one(x, x == 3)");
    yes("[1, 2, 3].filter(x, x > 1).map(x, x * 10) == [20, 30]");
    yes(r#"device.attributes["gpu.example.com"].exists(k, k == "model")"#);
    eval_err("[].min() == 0", "list is empty");
}

#[test]
fn regex_library() {
    yes(r#""abc 123 def 456".find("[0-9]+") == "123""#);
    yes(r#""abc".find("[0-9]+") == """#);
    yes(r#""abc 123 def 456".findAll("[0-9]+") == ["123", "456"]"#);
    yes(r#""a1b2c3".findAll("[0-9]", 2) == ["1", "2"]"#);
    eval_err(r#""abc".find("(") == """#, "find");
}

#[test]
fn optionals() {
    yes(r#"device.attributes["gpu.example.com"].?model.orValue("none") == "A100""#);
    yes(r#"device.attributes["gpu.example.com"].?nope.orValue("none") == "none""#);
    yes(r#"!device.attributes["unknown.com"].?x.hasValue()"#);
    yes(r#"optional.of(1).or(optional.none()).value() == 1"#);
}

// ---- IP and CIDR ----------------------------------------------------------------------------

#[test]
fn ip_and_cidr_libraries() {
    yes(r#"isIP("10.0.0.1") && isIP("::1") && !isIP("10.0.0.256") && !isIP("fe80::1%eth0")"#);
    yes(r#"!isIP("::ffff:10.0.0.1") && !isIP("010.0.0.1")"#);
    yes(r#"ip("10.0.0.1").family() == 4 && ip("::1").family() == 6"#);
    yes(
        r#"ip.isCanonical("2001:db8::1") && !ip.isCanonical("2001:DB8::1") && !ip.isCanonical("2001:db8:0::1")"#,
    );
    yes(r#"ip("127.0.0.1").isLoopback() && ip("0.0.0.0").isUnspecified() && ip("::").isUnspecified()"#);
    yes(r#"ip("169.254.1.1").isLinkLocalUnicast() && ip("fe80::1").isLinkLocalUnicast()"#);
    yes(r#"ip("224.0.0.1").isLinkLocalMulticast() && ip("ff02::1").isLinkLocalMulticast()"#);
    yes(
        r#"ip("10.0.0.1").isGlobalUnicast() && !ip("255.255.255.255").isGlobalUnicast() && !ip("127.0.0.1").isGlobalUnicast()"#,
    );
    yes(r#"string(ip("10.0.0.1")) == "10.0.0.1" && ip("10.0.0.1") == ip("10.0.0.1")"#);
    yes(r#"isCIDR("10.0.0.0/8") && !isCIDR("10.0.0.0/33") && !isCIDR("10.0.0.0") && !isCIDR("10.0.0.0/08")"#);
    yes(r#"cidr("10.0.0.0/8").containsIP(ip("10.1.2.3")) && cidr("10.0.0.0/8").containsIP("10.1.2.3")"#);
    yes(r#"!cidr("10.0.0.0/8").containsIP("11.0.0.1") && !cidr("10.0.0.0/8").containsIP("::1")"#);
    yes(
        r#"cidr("10.0.0.0/8").containsCIDR("10.1.0.0/16") && !cidr("10.1.0.0/16").containsCIDR("10.0.0.0/8")"#,
    );
    yes(r#"cidr("10.1.2.3/8").ip() == ip("10.1.2.3") && cidr("10.1.2.3/8").masked() == cidr("10.0.0.0/8")"#);
    yes(r#"cidr("2001:db8::/32").prefixLength() == 32 && string(cidr("10.0.0.0/8")) == "10.0.0.0/8""#);
    yes(
        r#"cidr("0.0.0.0/0").containsIP("1.2.3.4") && cidr(device.attributes["gpu.example.com"].cidr).containsIP("10.1.9.9")"#,
    );
}

// ---- the selector cache ---------------------------------------------------------------------

#[test]
fn cache_compiles_each_expression_once() {
    let mut cache = SelectorCache::new();
    let a = cache
        .get("device.driver == 'x'")
        .expect("compiles")
        .expression()
        .to_owned();
    assert_eq!(a, "device.driver == 'x'");
    assert!(cache.get("device.driver == 'x'").is_ok());
    assert!(cache.get("nope").is_err());
    assert!(cache.get("nope").is_err());
    assert_eq!(cache.len(), 2);
}

// ---- the conformance vectors ----------------------------------------------------------------

fn vectors() -> Json {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../../shared/conformance/dra_allocator_cases.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

fn selector_exprs(selectors: &Json) -> Vec<String> {
    selectors
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s["cel"]["expression"].as_str().map(str::to_owned))
        .collect()
}

/// Every CEL selector in the vectors compiles (or fails to as upstream's did), and every device
/// an expected allocation picks for a request matches its class's and its request's selectors.
#[test]
fn conformance_vectors() {
    let v = vectors();
    let cases = v["cases"].as_array().expect("cases");
    let mut compiled = 0;
    let mut matched = 0;
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let expect = &case["expect"];
        let error_text = expect["error_text"].as_str().unwrap_or("");
        let class_selectors: BTreeMap<String, Vec<String>> = case["classes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                (
                    c["metadata"]["name"].as_str().unwrap_or("").to_owned(),
                    selector_exprs(&c["spec"]["selectors"]),
                )
            })
            .collect();
        // request name ("req" or "req/sub") -> (class, selectors)
        let mut requests: Vec<BTreeMap<String, (String, Vec<String>)>> = Vec::new();
        for claim in case["claims"].as_array().into_iter().flatten() {
            let mut by_name = BTreeMap::new();
            for r in claim["spec"]["devices"]["requests"]
                .as_array()
                .into_iter()
                .flatten()
            {
                let rname = r["name"].as_str().unwrap_or("").to_owned();
                if r["exactly"].is_object() {
                    let e = &r["exactly"];
                    by_name.insert(
                        rname.clone(),
                        (
                            e["deviceClassName"].as_str().unwrap_or("").to_owned(),
                            selector_exprs(&e["selectors"]),
                        ),
                    );
                }
                for sub in r["firstAvailable"].as_array().into_iter().flatten() {
                    by_name.insert(
                        format!("{rname}/{}", sub["name"].as_str().unwrap_or("")),
                        (
                            sub["deviceClassName"].as_str().unwrap_or("").to_owned(),
                            selector_exprs(&sub["selectors"]),
                        ),
                    );
                }
            }
            requests.push(by_name);
        }
        let all_exprs = class_selectors
            .values()
            .flatten()
            .chain(requests.iter().flat_map(|r| r.values().flat_map(|(_, s)| s)));
        for expr in all_exprs {
            compiled += 1;
            match Selector::compile(expr) {
                Ok(_) => {}
                Err(CelError::Compile { reason, .. }) => {
                    assert!(
                        !reason.is_empty() && error_text.ends_with(&format!("CEL compile error: {reason}")),
                        "{name}: `{expr}` failed to compile: {reason}\nupstream: {error_text}"
                    );
                }
                Err(e) => panic!("{name}: `{expr}`: {e}"),
            }
        }
        // Devices by driver/pool/name.
        let mut devices: BTreeMap<(String, String, String), Device> = BTreeMap::new();
        for slice in case["slices"].as_array().into_iter().flatten() {
            let spec = &slice["spec"];
            let driver = spec["driver"].as_str().unwrap_or("").to_owned();
            let pool = spec["pool"]["name"].as_str().unwrap_or("").to_owned();
            for d in spec["devices"].as_array().into_iter().flatten() {
                let dev: Device = serde_json::from_value(d.clone()).expect("device");
                devices.insert((driver.clone(), pool.clone(), dev.name.clone()), dev);
            }
        }
        // A runtime error upstream reports comes from converting a device: every selector
        // fails on it the same way here.
        if let Some(wanted) = error_text.split("CEL runtime error: ").nth(1) {
            let sel = Selector::compile(r#"device.driver != """#).expect("compiles");
            let found = devices.iter().any(|((driver, pool, dname), dev)| {
                let id = format!("{driver}/{pool}/{dname}");
                let view = DeviceView {
                    driver,
                    id: &id,
                    attributes: dev.attributes.as_ref(),
                    capacity: dev.capacity.as_ref(),
                    allow_multiple_allocations: dev.allow_multiple_allocations,
                };
                matches!(sel.matches(&view), Err(CelError::Evaluate { reason, .. }) if reason == wanted)
            });
            assert!(found, "{name}: no device fails with {wanted:?}");
        }
        if expect["outcome"] != "success" {
            continue;
        }
        for (i, result) in expect["results"].as_array().into_iter().flatten().enumerate() {
            for r in result["devices"]["results"].as_array().into_iter().flatten() {
                let request = r["request"].as_str().unwrap_or("");
                let key = (
                    r["driver"].as_str().unwrap_or("").to_owned(),
                    r["pool"].as_str().unwrap_or("").to_owned(),
                    r["device"].as_str().unwrap_or("").to_owned(),
                );
                let dev = devices
                    .get(&key)
                    .unwrap_or_else(|| panic!("{name}: device {key:?} not in slices"));
                let (class, own) = requests[i]
                    .get(request)
                    .unwrap_or_else(|| panic!("{name}: request {request} unknown"));
                let id = format!("{}/{}/{}", key.0, key.1, key.2);
                let view = DeviceView {
                    driver: &key.0,
                    id: &id,
                    attributes: dev.attributes.as_ref(),
                    capacity: dev.capacity.as_ref(),
                    allow_multiple_allocations: dev.allow_multiple_allocations,
                };
                for expr in class_selectors.get(class).into_iter().flatten().chain(own) {
                    let sel = Selector::compile(expr).expect("compiled above");
                    assert_eq!(
                        sel.matches(&view),
                        Ok(true),
                        "{name}: {id} for {request} must match `{expr}`"
                    );
                    matched += 1;
                }
            }
        }
    }
    assert!(compiled > 100, "{compiled} selectors compiled");
    assert!(matched > 100, "{matched} selector matches checked");
}

/// Selectors the vectors use, on devices they must not pick.
#[test]
fn conformance_selectors_reject_what_they_should() {
    let mem = |q: &str| DeviceMap::from_iter([("memory".to_owned(), cap(q))]);
    let small = mem("1Gi");
    let large = mem("8Gi");
    let view = |c| DeviceView {
        driver: "driver-a",
        id: "driver-a/pool-1/device",
        attributes: None,
        capacity: Some(c),
        allow_multiple_allocations: Some(false),
    };
    let s = Selector::compile(r#"device.capacity["driver-a"].memory.compareTo(quantity("2Gi")) >= 0"#)
        .expect("compiles");
    assert_eq!(s.matches(&view(&small)), Ok(false));
    assert_eq!(s.matches(&view(&large)), Ok(true));
    let s = Selector::compile(r#"device.driver == "driver-a" && device.allowMultipleAllocations == true"#)
        .expect("compiles");
    assert_eq!(s.matches(&view(&small)), Ok(false));
    // A device without the attribute: "no such key", as upstream.
    let s = Selector::compile(r#"device.attributes["driver-a"].type == "X""#).expect("compiles");
    assert!(
        matches!(s.matches(&view(&small)), Err(CelError::Evaluate { reason, .. }) if reason == "no such key: type")
    );
}

#[test]
fn two_variable_comprehensions() {
    yes("[10, 20].all(i, v, v == (i + 1) * 10)");
    yes("{'a': 1, 'b': 2}.exists(k, v, k == 'b' && v == 2)");
    yes("[1, 2, 3].existsOne(i, v, v == 2) && ![2, 2].existsOne(i, v, v == 2)");
    yes("[1, 2, 3].transformList(i, v, i * v) == [0, 2, 6]");
    yes("[1, 2, 3].transformList(i, v, i > 0, v) == [2, 3]");
    yes("{'a': 1}.transformMap(k, v, v + 1) == {'a': 2}");
    yes("{'a': 1, 'b': 2}.transformMap(k, v, v > 1, v) == {'b': 2}");
    yes("[1, 2].transformMapEntry(i, v, {string(v): i}) == {'1': 0, '2': 1}");
    eval_err(
        "[1, 1].transformMapEntry(i, v, {'x': v}) == {}",
        "key already exists",
    );
    yes(r#"device.attributes["gpu.example.com"].exists(k, v, k == "numa" && v == 1)"#);
    yes("[1, 2].all(x, x > 0)");
    compile_err("[1].all(i, i, true)", "duplicate variable");
    compile_err("[1].all(i, v, w)", "undeclared reference to 'w'");
}
