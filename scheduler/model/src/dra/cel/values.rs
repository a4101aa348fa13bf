//! The values a selector sees that the `cel` crate does not have: the `device` object, its
//! attribute and capacity maps (an unknown domain reads as an empty map), Kubernetes
//! quantities and semantic versions, and the IP and CIDR types of the base environment.

use std::any::Any;
use std::cmp::Ordering;
use std::collections::HashMap;
use std::net::IpAddr;

use cel::ExecutionError;
use cel::common::traits::{Container, Indexer, Iterable, Sizer};
use cel::common::types::{CelBool, CelInt, CelMap, CelMapKey, CelString, MAP_TYPE, Type};
use cel::common::value::{CowVal, StaticVal, Val};
use numaplane::quantity::Quantity;

use super::DeviceView;

pub(super) static DEVICE_TYPE: Type = Type::new_unspecified_type("kubernetes.DRADevice");
pub(super) static QUANTITY_TYPE: Type = Type::new_unspecified_type("kubernetes.Quantity");
pub(super) static SEMVER_TYPE: Type = Type::new_unspecified_type("kubernetes.Semver");
pub(super) static IP_TYPE: Type = Type::new_unspecified_type("net.IP");
pub(super) static CIDR_TYPE: Type = Type::new_unspecified_type("net.CIDR");

/// Implements the parts of [`Val`] every `'static` value type here shares.
macro_rules! static_val {
    ($ty:ty, $cel:expr, |$a:ident, $b:ident| $eq:expr) => {
        impl Val for $ty {
            fn get_type(&self) -> &Type {
                &$cel
            }
            fn cel_type() -> &'static Type {
                &$cel
            }
            fn equals(&self, other: &dyn Val) -> bool {
                let $a = self;
                other.downcast_ref::<$ty>().is_some_and(|$b| $eq)
            }
            fn clone_as_boxed<'v>(&self) -> Box<dyn Val + 'v>
            where
                Self: 'v,
            {
                Box::new(self.clone())
            }
            fn as_any(&self) -> Option<&dyn Any> {
                Some(self)
            }
        }
        impl StaticVal for $ty {}
    };
}

/// A Kubernetes quantity (`kubernetes.Quantity`): equal by value, `1Ki == 1024`.
#[derive(Debug, Clone, Copy)]
pub(super) struct QuantityVal(pub Quantity);
static_val!(QuantityVal, QUANTITY_TYPE, |a, b| a.0 == b.0);

/// A semantic version (`kubernetes.Semver`): equal by precedence, build metadata ignored, as
/// blang/semver's `EQ`.
#[derive(Debug, Clone)]
pub(super) struct SemverVal(pub semver::Version);
static_val!(SemverVal, SEMVER_TYPE, |a, b| a.0.cmp_precedence(&b.0)
    == Ordering::Equal);

/// An IP address (`net.IP`).
#[derive(Debug, Clone, Copy)]
pub(super) struct IpVal(pub IpAddr);
static_val!(IpVal, IP_TYPE, |a, b| a.0 == b.0);

/// A CIDR prefix (`net.CIDR`), host bits kept as written (Go's `netip.Prefix`).
#[derive(Debug, Clone, Copy)]
pub(super) struct CidrVal {
    pub addr: IpAddr,
    pub bits: u8,
}
static_val!(CidrVal, CIDR_TYPE, |a, b| a.addr == b.addr && a.bits == b.bits);

/// `device.attributes` / `device.capacity`: a map from domain to a map from id to value,
/// where a domain without entries reads as an empty map rather than a missing key (kube's
/// `newStringInterfaceMapWithDefault`). `in`, `size` and iteration see the real domains only.
#[derive(Debug, Clone, Default)]
pub(super) struct DomainsVal<'v>(CelMap<'v>);

impl<'v> Val for DomainsVal<'v> {
    fn get_type(&self) -> &Type {
        &MAP_TYPE
    }
    fn cel_type() -> &'static Type {
        &MAP_TYPE
    }
    fn as_container(&self) -> Option<&dyn Container> {
        self.0.as_container()
    }
    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }
    fn as_iterable<'b, 'w>(&'b self) -> Option<&'b (dyn Iterable + 'w)>
    where
        Self: 'w,
    {
        self.0.as_iterable()
    }
    fn as_sizer(&self) -> Option<&dyn Sizer> {
        self.0.as_sizer()
    }
    fn equals(&self, other: &dyn Val) -> bool {
        self.0.equals(other)
    }
    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(self.clone())
    }
}

impl<'v> Indexer for DomainsVal<'v> {
    fn get<'b, 'w>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        match self.0.get(idx) {
            Err(ExecutionError::NoSuchKey(_)) => Ok(CowVal::owned(CelMap::default())),
            other => other,
        }
    }

    fn steal<'w>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

/// The `device` variable: an object with the fields `driver`, `attributes`, `capacity` and
/// `allowMultipleAllocations`.
#[derive(Debug, Clone)]
pub(super) struct DeviceObj<'v> {
    driver: CelString<'v>,
    attributes: DomainsVal<'v>,
    capacity: DomainsVal<'v>,
    allow_multiple_allocations: CelBool,
}

impl<'v> Val for DeviceObj<'v> {
    fn get_type(&self) -> &Type {
        &DEVICE_TYPE
    }
    fn cel_type() -> &'static Type {
        &DEVICE_TYPE
    }
    fn as_indexer<'b, 'w>(&'b self) -> Option<&'b (dyn Indexer + 'w)>
    where
        Self: 'w,
    {
        Some(self)
    }
    fn clone_as_boxed<'w>(&self) -> Box<dyn Val + 'w>
    where
        Self: 'w,
    {
        Box::new(self.clone())
    }
}

impl<'v> Indexer for DeviceObj<'v> {
    fn get<'b, 'w>(&'b self, idx: &dyn Val) -> Result<CowVal<'b, 'w>, ExecutionError>
    where
        Self: 'w,
    {
        let field = idx
            .downcast_ref::<CelString<'_>>()
            .map(CelString::inner)
            .unwrap_or_default();
        Ok(match field {
            "driver" => CowVal::Borrowed(&self.driver),
            "attributes" => CowVal::Borrowed(&self.attributes),
            "capacity" => CowVal::Borrowed(&self.capacity),
            "allowMultipleAllocations" => CowVal::Borrowed(&self.allow_multiple_allocations),
            other => return Err(ExecutionError::no_such_key(other)),
        })
    }

    fn steal<'w>(self: Box<Self>, idx: &dyn Val) -> Result<Box<dyn Val + 'w>, ExecutionError>
    where
        Self: 'w,
    {
        self.get(idx).map(CowVal::into_owned)
    }
}

/// Which parts of the device an expression reads: the maps are only built when read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Needs {
    pub attributes: bool,
    pub capacity: bool,
}

/// Splits a qualified name into domain and id; a name without a domain is the driver's.
fn qualified<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    name.split_once('/').unwrap_or((driver, name))
}

/// Parses a version attribute as kube does (blang/semver `Parse`).
pub(super) fn parse_semver(s: &str) -> Result<semver::Version, String> {
    s.parse::<semver::Version>().map_err(|e| e.to_string())
}

/// Builds the `device` value, or says which attribute or capacity could not be read.
pub(super) fn device_obj<'a>(view: &DeviceView<'a>, needs: Needs) -> Result<DeviceObj<'a>, String> {
    // kube converts every attribute before evaluating, so a bad one fails every selector,
    // even one that reads only `device.driver`; the maps themselves are only built if read.
    let mut attributes: HashMap<&'a str, HashMap<CelMapKey<'a>, Box<dyn Val + 'a>>> = HashMap::new();
    for (name, attr) in view.attributes.into_iter().flatten() {
        if !needs.attributes {
            // Only what can fail: a missing value, or a version that is not one.
            if attr.int.is_none() && attr.bool.is_none() && attr.string.is_none() {
                match &attr.version {
                    Some(v) => {
                        parse_semver(v)
                            .map_err(|e| format!("attribute {name}: parse semantic version: {e}"))?;
                    }
                    None => return Err(format!("attribute {name}: unsupported attribute value")),
                }
            }
            continue;
        }
        // kube's order: int, bool, string, version.
        let value: Box<dyn Val + 'a> = if let Some(i) = attr.int {
            Box::new(CelInt::from(i))
        } else if let Some(b) = attr.bool {
            Box::new(CelBool::from(b))
        } else if let Some(s) = &attr.string {
            Box::new(CelString::from(s.as_str()))
        } else if let Some(v) = &attr.version {
            let v = parse_semver(v).map_err(|e| format!("attribute {name}: parse semantic version: {e}"))?;
            Box::new(SemverVal(v))
        } else {
            return Err(format!("attribute {name}: unsupported attribute value"));
        };
        let (domain, id) = qualified(name, view.driver);
        attributes
            .entry(domain)
            .or_default()
            .insert(CelMapKey::from(id), value);
    }
    let mut capacity: HashMap<&'a str, HashMap<CelMapKey<'a>, Box<dyn Val + 'a>>> = HashMap::new();
    // kube's capacities are parsed quantities already (the API server rejects any other), so
    // they are parsed here only when the selector reads them.
    for (name, cap) in view.capacity.into_iter().flatten().filter(|_| needs.capacity) {
        let q = Quantity::try_from(&cap.value).map_err(|e| format!("capacity {name}: {e}"))?;
        {
            let (domain, id) = qualified(name, view.driver);
            capacity
                .entry(domain)
                .or_default()
                .insert(CelMapKey::from(id), Box::new(QuantityVal(q)));
        }
    }
    Ok(DeviceObj {
        driver: CelString::from(view.driver),
        attributes: domains(attributes),
        capacity: domains(capacity),
        allow_multiple_allocations: CelBool::from(view.allow_multiple_allocations.unwrap_or(false)),
    })
}

fn domains<'a>(by_domain: HashMap<&'a str, HashMap<CelMapKey<'a>, Box<dyn Val + 'a>>>) -> DomainsVal<'a> {
    let outer: HashMap<CelMapKey<'a>, Box<dyn Val + 'a>> = by_domain
        .into_iter()
        .map(|(domain, inner)| {
            (
                CelMapKey::from(domain),
                Box::new(CelMap::from(inner)) as Box<dyn Val + 'a>,
            )
        })
        .collect();
    DomainsVal(CelMap::from(outer))
}
