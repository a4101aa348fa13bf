//! DRA CEL selectors: cost of compiling a selector once, and of evaluating it on one device
//! (what the allocator pays per device and selector, before its own per-device cache).
//!
//! `cargo bench -p numaplane-scheduler --bench cel_selectors -- [ITERATIONS]` (default 200000).
//! Prints ns per compile and per evaluation for typical selectors on a device with 6 attributes
//! and 2 capacities.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use numaplane_scheduler::dra::slice::DeviceMap;
use std::hint::black_box;
use std::time::Instant;

use k8s_openapi::api::resource::v1::{DeviceAttribute, DeviceCapacity};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use numaplane_scheduler::dra::cel::{DeviceView, Selector};

const SELECTORS: &[&str] = &[
    r#"device.driver == "gpu.example.com""#,
    r#"device.attributes["gpu.example.com"].model == "A100" && device.attributes["gpu.example.com"].numa == 1"#,
    r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("16Gi")) >= 0"#,
    r#"device.attributes["gpu.example.com"].driverVersion.isGreaterThan(semver("1.0.0"))"#,
    r#"cel.bind(a, device.attributes["gpu.example.com"], a.model.startsWith("A") && a.numa < 4 && !a.mig)"#,
];

fn main() {
    let iterations: u32 = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .and_then(|a| a.parse().ok())
        .unwrap_or(200_000);
    let attr = |f: fn(&mut DeviceAttribute)| {
        let mut a = DeviceAttribute::default();
        f(&mut a);
        a
    };
    let attributes = DeviceMap::from_iter([
        ("model".to_owned(), attr(|a| a.string = Some("A100".into()))),
        ("numa".to_owned(), attr(|a| a.int = Some(1))),
        ("mig".to_owned(), attr(|a| a.bool = Some(false))),
        (
            "driverVersion".to_owned(),
            attr(|a| a.version = Some("1.2.3".into())),
        ),
        (
            "uuid".to_owned(),
            attr(|a| a.string = Some("GPU-5f4b6e3a-1c2d".into())),
        ),
        (
            "other.com/color".to_owned(),
            attr(|a| a.string = Some("blue".into())),
        ),
    ]);
    let cap = |q: &str| DeviceCapacity {
        value: Quantity(q.into()),
        ..Default::default()
    };
    let capacity = DeviceMap::from_iter([
        ("memory".to_owned(), cap("40Gi")),
        ("cores".to_owned(), cap("108")),
    ]);
    let view = DeviceView {
        driver: "gpu.example.com",
        id: "gpu.example.com/pool/gpu-0",
        attributes: Some(&attributes),
        capacity: Some(&capacity),
        allow_multiple_allocations: None,
    };
    println!("iterations: {iterations}");
    for expr in SELECTORS {
        let compiles = 200;
        let start = Instant::now();
        for _ in 0..compiles {
            black_box(Selector::compile(black_box(expr)).unwrap());
        }
        let compile_ns = start.elapsed().as_nanos() / compiles;
        let selector = Selector::compile(expr).unwrap();
        assert!(selector.matches(&view).unwrap(), "{expr}");
        let start = Instant::now();
        for _ in 0..iterations {
            black_box(selector.matches(black_box(&view)).unwrap());
        }
        let eval_ns = start.elapsed().as_nanos() / u128::from(iterations);
        println!("compile {compile_ns:>8} ns   evaluate {eval_ns:>6} ns   {expr}");
    }
    // The same first selector on a device without attributes or capacities: what converting
    // the device costs.
    let bare = DeviceView {
        attributes: None,
        capacity: None,
        ..view
    };
    let selector = Selector::compile(SELECTORS[0]).unwrap();
    let start = Instant::now();
    for _ in 0..iterations {
        black_box(selector.matches(black_box(&bare)).unwrap());
    }
    let eval_ns = start.elapsed().as_nanos() / u128::from(iterations);
    println!(
        "                   evaluate {eval_ns:>6} ns   {} (device without attributes)",
        SELECTORS[0]
    );
}
