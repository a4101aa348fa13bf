//! Kubernetes' IP and CIDR libraries (`ip()`, `cidr()` and their members), as kube's
//! `library/ip.go` and `library/cidr.go` declare them, on Go's `netip` parsing rules.

use std::net::IpAddr;

use cel::common::types::{CelBool, CelInt, CelString, STRING_TYPE};
use cel::{DeclarationError, Env, ExecutionError};

use super::super::values::{CIDR_TYPE, CidrVal, IP_TYPE, IpVal};
use super::{arg, owned, s};

/// kube's `ip()`: netip.ParseAddr, without zones or IPv4-mapped IPv6 addresses.
fn parse_ip(input: &str) -> Result<IpAddr, String> {
    if input.contains('%') {
        return Err("IP address with zone value is not allowed".into());
    }
    let addr: IpAddr = input
        .parse()
        .map_err(|_| format!("IP Address {input:?} parse error during conversion from string"))?;
    if let IpAddr::V6(v6) = addr
        && v6.to_ipv4_mapped().is_some()
    {
        return Err("IPv4-mapped IPv6 address is not allowed".into());
    }
    Ok(addr)
}

/// kube's `cidr()`: netip.ParsePrefix, without zones or IPv4-mapped IPv6 addresses.
fn parse_cidr(input: &str) -> Result<CidrVal, String> {
    let err = || format!("network address {input:?} parse error during conversion from string");
    let (addr, bits) = input.split_once('/').ok_or_else(err)?;
    if addr.contains('%') {
        return Err("CIDR with zone value is not allowed".into());
    }
    let addr: IpAddr = addr.parse().map_err(|_| err())?;
    if let IpAddr::V6(v6) = addr
        && v6.to_ipv4_mapped().is_some()
    {
        return Err("IPv4-mapped IPv6 address is not allowed".into());
    }
    // Go: decimal digits only, no leading zero, at most the address length.
    if bits.is_empty()
        || !bits.bytes().all(|b| b.is_ascii_digit())
        || (bits.len() > 1 && bits.starts_with('0'))
    {
        return Err(err());
    }
    let bits: u8 = bits.parse().map_err(|_| err())?;
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if bits > max {
        return Err(err());
    }
    Ok(CidrVal { addr, bits })
}

fn masked(c: &CidrVal) -> IpAddr {
    match c.addr {
        IpAddr::V4(a) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(c.bits)).unwrap_or(0);
            IpAddr::V4((u32::from(a) & mask).into())
        }
        IpAddr::V6(a) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(c.bits)).unwrap_or(0);
            IpAddr::V6((u128::from(a) & mask).into())
        }
    }
}

fn cidr_contains_ip(c: &CidrVal, ip: IpAddr) -> bool {
    ip.is_ipv4() == c.addr.is_ipv4()
        && masked(&CidrVal {
            addr: ip,
            bits: c.bits,
        }) == masked(c)
}

fn ip_fn(function: &str, e: String) -> ExecutionError {
    ExecutionError::function_error(function, e)
}

fn is_link_local_unicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.octets()[0] == 169 && a.octets()[1] == 254,
        IpAddr::V6(a) => a.segments()[0] & 0xffc0 == 0xfe80,
    }
}

fn is_link_local_multicast(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => a.octets()[..3] == [224, 0, 0],
        IpAddr::V6(a) => a.segments()[0] & 0xff0f == 0xff02,
    }
}

/// Go's `netip.Addr.IsGlobalUnicast`.
fn is_global_unicast(ip: IpAddr) -> bool {
    if let IpAddr::V4(a) = ip
        && a.is_broadcast()
    {
        return false;
    }
    !ip.is_unspecified() && !ip.is_loopback() && !ip.is_multicast() && !is_link_local_unicast(ip)
}

pub(super) fn ip_lib(env: &mut Env) -> Result<(), DeclarationError> {
    let ip = || IP_TYPE.to_owned();
    let cidr = || CIDR_TYPE.to_owned();
    env.add_overload("ip", "string_to_ip", vec![STRING_TYPE], |a| {
        owned(IpVal(parse_ip(s(&a, 0)?).map_err(|e| ip_fn("ip", e))?))
    })?;
    env.add_overload("isIP", "is_ip", vec![STRING_TYPE], |a| {
        owned(CelBool::from(parse_ip(s(&a, 0)?).is_ok()))
    })?;
    env.add_overload("ip.isCanonical", "ip_is_canonical", vec![STRING_TYPE], |a| {
        let input = s(&a, 0)?;
        let addr = parse_ip(input).map_err(|e| ip_fn("ip.isCanonical", e))?;
        owned(CelBool::from(addr.to_string() == input))
    })?;
    env.add_overload("string", "ip_to_string", vec![ip()], |a| {
        owned(CelString::from(arg::<IpVal>(&a, 0)?.0.to_string()))
    })?;
    env.add_member_overload("family", "ip_family", ip(), vec![], |a| {
        owned(CelInt::from(if arg::<IpVal>(&a, 0)?.0.is_ipv4() { 4 } else { 6 }))
    })?;
    env.add_member_overload("isUnspecified", "ip_is_unspecified", ip(), vec![], |a| {
        owned(CelBool::from(arg::<IpVal>(&a, 0)?.0.is_unspecified()))
    })?;
    env.add_member_overload("isLoopback", "ip_is_loopback", ip(), vec![], |a| {
        owned(CelBool::from(arg::<IpVal>(&a, 0)?.0.is_loopback()))
    })?;
    env.add_member_overload(
        "isLinkLocalMulticast",
        "ip_is_link_local_multicast",
        ip(),
        vec![],
        |a| owned(CelBool::from(is_link_local_multicast(arg::<IpVal>(&a, 0)?.0))),
    )?;
    env.add_member_overload(
        "isLinkLocalUnicast",
        "ip_is_link_local_unicast",
        ip(),
        vec![],
        |a| owned(CelBool::from(is_link_local_unicast(arg::<IpVal>(&a, 0)?.0))),
    )?;
    env.add_member_overload("isGlobalUnicast", "ip_is_global_unicast", ip(), vec![], |a| {
        owned(CelBool::from(is_global_unicast(arg::<IpVal>(&a, 0)?.0)))
    })?;

    env.add_overload("cidr", "string_to_cidr", vec![STRING_TYPE], |a| {
        owned(parse_cidr(s(&a, 0)?).map_err(|e| ip_fn("cidr", e))?)
    })?;
    env.add_overload("isCIDR", "is_cidr", vec![STRING_TYPE], |a| {
        owned(CelBool::from(parse_cidr(s(&a, 0)?).is_ok()))
    })?;
    env.add_overload("string", "cidr_to_string", vec![cidr()], |a| {
        let c = arg::<CidrVal>(&a, 0)?;
        owned(CelString::from(format!("{}/{}", c.addr, c.bits)))
    })?;
    env.add_member_overload("containsIP", "cidr_contains_ip_ip", cidr(), vec![ip()], |a| {
        owned(CelBool::from(cidr_contains_ip(
            arg::<CidrVal>(&a, 0)?,
            arg::<IpVal>(&a, 1)?.0,
        )))
    })?;
    env.add_member_overload(
        "containsIP",
        "cidr_contains_ip_string",
        cidr(),
        vec![STRING_TYPE],
        |a| {
            let ip = parse_ip(s(&a, 1)?).map_err(|e| ip_fn("containsIP", e))?;
            owned(CelBool::from(cidr_contains_ip(arg::<CidrVal>(&a, 0)?, ip)))
        },
    )?;
    fn contains_cidr(c: &CidrVal, o: &CidrVal) -> bool {
        o.bits >= c.bits && cidr_contains_ip(c, o.addr)
    }
    env.add_member_overload("containsCIDR", "cidr_contains_cidr", cidr(), vec![cidr()], |a| {
        owned(CelBool::from(contains_cidr(
            arg::<CidrVal>(&a, 0)?,
            arg::<CidrVal>(&a, 1)?,
        )))
    })?;
    env.add_member_overload(
        "containsCIDR",
        "cidr_contains_cidr_string",
        cidr(),
        vec![STRING_TYPE],
        |a| {
            let o = parse_cidr(s(&a, 1)?).map_err(|e| ip_fn("containsCIDR", e))?;
            owned(CelBool::from(contains_cidr(arg::<CidrVal>(&a, 0)?, &o)))
        },
    )?;
    env.add_member_overload("ip", "cidr_ip", cidr(), vec![], |a| {
        owned(IpVal(arg::<CidrVal>(&a, 0)?.addr))
    })?;
    env.add_member_overload("masked", "cidr_masked", cidr(), vec![], |a| {
        let c = arg::<CidrVal>(&a, 0)?;
        owned(CidrVal {
            addr: masked(c),
            bits: c.bits,
        })
    })?;
    env.add_member_overload("prefixLength", "cidr_prefix_length", cidr(), vec![], |a| {
        owned(CelInt::from(i64::from(arg::<CidrVal>(&a, 0)?.bits)))
    })?;
    Ok(())
}
