//! Exact Kubernetes resource quantities (Go's `k8s.io/apimachinery/pkg/api/resource.Quantity`).
//!
//! Written by hand: the `kube_quantity` crate (0.9) does arithmetic but does not produce
//! Kubernetes' canonical form ("2.5Gi" stays "2.5Gi" where Kubernetes prints "2560Mi").
//!
//! Semantics follow Go's `ParseQuantity` and `CanonicalizeBytes`:
//! * the value is exact, stored as an `i128` count of nano-units; a finer non-zero value is
//!   rounded away from zero to the next nano ("1.1n" is 2n, "-1.1n" is -2n);
//! * a BinarySI value is capped at 2^63-1 units in magnitude when parsed ("9Ei" is
//!   9223372036854775807); decimal values are not capped, as in Go, but must fit the `i128`
//!   (|value| ≤ about 1.7e29 units) or parsing fails with [`QuantityError::OutOfRange`];
//! * the suffix type of the input is remembered and reused when printing, in canonical form:
//!   no fractional digits, the largest exponent that loses no precision ("1.5" → "1500m",
//!   "1.5Gi" → "1536Mi", "1e3" → "1e3").
//!
//! Known, deliberate differences from Go, all on inputs no Kubernetes component writes:
//! * the number must contain a digit: Go accepts "-", "." or "m" alone as zero, we reject them
//!   (the CRD validation pattern rejects them too);
//! * Go prints no suffix past `Ei` (silently dropping the magnitude of a BinarySI sum ≥ 1024Ei),
//!   we keep printing `Ei` multiples;
//! * Go's fixed-point fallback is unbounded, so arithmetic beyond the `i128` range saturates here.
//!
//! ```
//! use numaplane::quantity::Quantity;
//! let q: Quantity = "1.5Gi".parse()?;
//! assert_eq!(q.to_string(), "1536Mi");
//! assert_eq!(q, "1610612736".parse()?);
//! # Ok::<(), numaplane::quantity::QuantityError>(())
//! ```

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::iter::Sum;
use std::ops::{Add, AddAssign, Neg, Sub, SubAssign};
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::api::resource::Quantity as K8sQuantity;
use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

const NANOS_PER_UNIT: i128 = 1_000_000_000;
const NANOS_PER_UNIT_U: u128 = 1_000_000_000;
const NANOS_PER_MILLI_U: u128 = 1_000_000;
/// Go caps a parsed BinarySI magnitude at 2^63-1 units.
const MAX_BINARY_NANOS: u128 = (i64::MAX as u128) * NANOS_PER_UNIT_U;
/// Magnitudes are kept symmetric so negation never overflows.
const MAX_NANOS: i128 = i128::MAX;
/// Longest input echoed back in an error message.
const MAX_ERROR_INPUT: usize = 64;

/// How a quantity is printed: the three suffix families of Kubernetes quantities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Format {
    /// `12e6`, `1e-3`: a decimal exponent.
    DecimalExponent,
    /// `12Mi`: powers of 1024 (`Ki` … `Ei`).
    BinarySI,
    /// `12M`, `500m`: SI prefixes `n u m k M G T P E`.
    DecimalSI,
}

impl Format {
    /// The Go name of the format (`DecimalExponent`, `BinarySI`, `DecimalSI`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Format::DecimalExponent => "DecimalExponent",
            Format::BinarySI => "BinarySI",
            Format::DecimalSI => "DecimalSI",
        }
    }
}

impl fmt::Display for Format {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a string is not a Kubernetes quantity. The input is echoed (cut at 64 bytes).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuantityError {
    /// The empty string.
    #[error("empty quantity")]
    Empty,
    /// The number part is missing or malformed (no digit, a second dot, a stray sign, junk).
    #[error("invalid quantity {input:?}: malformed number")]
    InvalidNumber {
        /// The rejected input.
        input: String,
    },
    /// The number is followed by something that is not a known suffix or decimal exponent.
    #[error("invalid quantity {input:?}: unknown suffix {suffix:?}")]
    UnknownSuffix {
        /// The rejected input.
        input: String,
        /// The unrecognised suffix.
        suffix: String,
    },
    /// The value does not fit the exact representation (about ±1.7e29 units).
    #[error("quantity {input:?} is out of the supported range")]
    OutOfRange {
        /// The rejected input.
        input: String,
    },
}

/// An exact Kubernetes quantity: a value in nano-units plus the format it prints in.
///
/// Equality, ordering and hashing look at the value only, so `1Ki == 1024`.
#[derive(Debug, Clone, Copy)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

/// A parsed suffix: what the number is multiplied by.
enum Suffix {
    /// 10^exp, DecimalSI.
    Decimal(i32),
    /// 1024^power, BinarySI.
    Binary(u32),
    /// 10^exp, DecimalExponent.
    Exponent(i32),
}

impl Suffix {
    fn interpret(s: &str) -> Option<Self> {
        Some(match s {
            "" => Suffix::Decimal(0),
            "n" => Suffix::Decimal(-9),
            "u" => Suffix::Decimal(-6),
            "m" => Suffix::Decimal(-3),
            "k" => Suffix::Decimal(3),
            "M" => Suffix::Decimal(6),
            "G" => Suffix::Decimal(9),
            "T" => Suffix::Decimal(12),
            "P" => Suffix::Decimal(15),
            "E" => Suffix::Decimal(18),
            "Ki" => Suffix::Binary(1),
            "Mi" => Suffix::Binary(2),
            "Gi" => Suffix::Binary(3),
            "Ti" => Suffix::Binary(4),
            "Pi" => Suffix::Binary(5),
            "Ei" => Suffix::Binary(6),
            _ => {
                // Go: strconv.ParseInt(s[1:], 10, 64), which takes an optional sign and digits.
                let rest = s.strip_prefix(['e', 'E'])?;
                let exp: i64 = rest.parse().ok()?;
                // Go then truncates with int32(parsed); keep that so both sides agree on a value.
                Suffix::Exponent(exp as i32)
            }
        })
    }
}

impl Quantity {
    /// Parses a quantity string (`<signedNumber><suffix>`) as Kubernetes does (see the module
    /// notes for the few deliberate differences).
    pub fn parse(input: &str) -> Result<Self, QuantityError> {
        let bytes = input.as_bytes();
        if bytes.is_empty() {
            return Err(QuantityError::Empty);
        }
        let (negative, int_start) = match bytes.first() {
            Some(b'-') => (true, 1),
            Some(b'+') => (false, 1),
            _ => (false, 0),
        };
        let int_end = scan_digits(bytes, int_start);
        let (frac_start, frac_end) = if bytes.get(int_end) == Some(&b'.') {
            (int_end + 1, scan_digits(bytes, int_end + 1))
        } else {
            (int_end, int_end)
        };
        let int_digits = bytes.get(int_start..int_end).unwrap_or_default();
        let frac_digits = bytes.get(frac_start..frac_end).unwrap_or_default();
        if int_digits.is_empty() && frac_digits.is_empty() {
            return Err(QuantityError::InvalidNumber {
                input: excerpt(input),
            });
        }
        // Only ASCII was consumed, so `frac_end` is a char boundary.
        let suffix = input.get(frac_end..).unwrap_or_default();
        if matches!(suffix.as_bytes().first(), Some(b'.' | b'+' | b'-')) {
            return Err(QuantityError::InvalidNumber {
                input: excerpt(input),
            });
        }
        let Some(kind) = Suffix::interpret(suffix) else {
            return Err(QuantityError::UnknownSuffix {
                input: excerpt(input),
                suffix: excerpt(suffix),
            });
        };

        // Significant digits of the mantissa; value = digits × 10^-frac_len × suffix.
        let mut digits: Vec<u8> = int_digits
            .iter()
            .chain(frac_digits)
            .map(|d| d - b'0')
            .skip_while(|&d| d == 0)
            .collect();
        let frac_len = i64::try_from(frac_digits.len()).unwrap_or(i64::MAX);
        let mut over_binary_cap = false;
        let (format, exp10) = match kind {
            Suffix::Decimal(e) => (Format::DecimalSI, e),
            Suffix::Exponent(e) => (Format::DecimalExponent, e),
            Suffix::Binary(power) => {
                let int_len = i64::try_from(digits.len())
                    .unwrap_or(i64::MAX)
                    .saturating_sub(frac_len);
                // 20 integer digits are ≥ 10^19 units, over the cap already: skip the work.
                if int_len >= 20 {
                    over_binary_cap = true;
                } else {
                    for _ in 0..power {
                        mul_small(&mut digits, 1024);
                    }
                }
                (Format::BinarySI, 0)
            }
        };
        if digits.is_empty() {
            return Ok(Quantity { nanos: 0, format });
        }
        let nanos_exp = i64::from(exp10).saturating_sub(frac_len).saturating_add(9);
        let magnitude = if over_binary_cap {
            None
        } else {
            scale_to_nanos(&digits, nanos_exp)
        };
        let (magnitude, format) = if format == Format::BinarySI {
            let m = magnitude.map_or(MAX_BINARY_NANOS, |m| m.min(MAX_BINARY_NANOS));
            // Go switches a fractional binary value below one unit to DecimalSI.
            (
                m,
                if m < NANOS_PER_UNIT_U {
                    Format::DecimalSI
                } else {
                    Format::BinarySI
                },
            )
        } else {
            match magnitude {
                Some(m) if m <= MAX_NANOS.unsigned_abs() => (m, format),
                _ => {
                    return Err(QuantityError::OutOfRange {
                        input: excerpt(input),
                    });
                }
            }
        };
        // magnitude ≤ i128::MAX in both branches.
        let nanos = i128::try_from(magnitude).unwrap_or(MAX_NANOS);
        Ok(Quantity {
            nanos: if negative { -nanos } else { nanos },
            format,
        })
    }

    /// Zero, DecimalSI (prints "0").
    pub const fn zero() -> Self {
        Quantity {
            nanos: 0,
            format: Format::DecimalSI,
        }
    }

    /// `value` whole units in the given format (Go's `NewQuantity`).
    pub const fn from_int(value: i64, format: Format) -> Self {
        Quantity {
            nanos: value as i128 * NANOS_PER_UNIT,
            format,
        }
    }

    /// `value` thousandths of a unit in the given format (Go's `NewMilliQuantity`).
    pub const fn from_milli(value: i64, format: Format) -> Self {
        Quantity {
            nanos: value as i128 * 1_000_000,
            format,
        }
    }

    /// `nanos` billionths of a unit in the given format (`i128::MIN` is clamped to `-i128::MAX`).
    pub const fn from_nanos(nanos: i128, format: Format) -> Self {
        Quantity {
            nanos: if nanos == i128::MIN { -MAX_NANOS } else { nanos },
            format,
        }
    }

    /// True if the value is zero.
    pub const fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    /// True if the value is below zero.
    pub const fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// The exact value in nano-units.
    pub const fn nanos(&self) -> i128 {
        self.nanos
    }

    /// The format used when printing.
    pub const fn format(&self) -> Format {
        self.format
    }

    /// The same value printed in another format (Go lets callers set `Format` freely).
    pub const fn with_format(self, format: Format) -> Self {
        Quantity {
            nanos: self.nanos,
            format,
        }
    }

    /// The value in thousandths, rounded away from zero (Go's `MilliValue`), saturating at the
    /// `i64` bounds.
    pub fn millis_ceil(&self) -> i64 {
        self.scaled_away_from_zero(NANOS_PER_MILLI_U)
    }

    /// The value in whole units, rounded away from zero (Go's `Value`: `500m` → 1), saturating
    /// at the `i64` bounds.
    pub fn value_ceil(&self) -> i64 {
        self.scaled_away_from_zero(NANOS_PER_UNIT_U)
    }

    /// The value if it is a whole number of units that fits an `i64`.
    pub fn as_i64_exact(&self) -> Option<i64> {
        if self.nanos % NANOS_PER_UNIT != 0 {
            return None;
        }
        i64::try_from(self.nanos / NANOS_PER_UNIT).ok()
    }

    fn scaled_away_from_zero(&self, per: u128) -> i64 {
        let m = self.nanos.unsigned_abs();
        let q = m / per + u128::from(!m.is_multiple_of(per));
        match (self.nanos < 0, i64::try_from(q)) {
            (false, Ok(v)) => v,
            (false, Err(_)) => i64::MAX,
            (true, _) => i64::try_from(q).map_or(i64::MIN, |v| -v),
        }
    }

    /// Go's format rule for `Add`/`Sub`: keep the left format unless the left value is zero.
    const fn result_format(&self, rhs: &Self) -> Format {
        if self.nanos == 0 { rhs.format } else { self.format }
    }

    /// `self + rhs`, or `None` if it leaves the representable range.
    pub fn checked_add(self, rhs: Self) -> Option<Self> {
        let nanos = self.nanos.checked_add(rhs.nanos).filter(|n| *n != i128::MIN)?;
        Some(Quantity {
            nanos,
            format: self.result_format(&rhs),
        })
    }

    /// `self - rhs`, or `None` if it leaves the representable range.
    pub fn checked_sub(self, rhs: Self) -> Option<Self> {
        let nanos = self.nanos.checked_sub(rhs.nanos).filter(|n| *n != i128::MIN)?;
        Some(Quantity {
            nanos,
            format: self.result_format(&rhs),
        })
    }

    /// `max(self - rhs, 0)`: what is left of a capacity after a request, never negative.
    pub fn saturating_sub_floor_zero(self, rhs: Self) -> Self {
        let nanos = self.nanos.saturating_sub(rhs.nanos).max(0);
        Quantity {
            nanos,
            format: self.result_format(&rhs),
        }
    }

    /// The canonical string, as Kubernetes prints it (same as `to_string`).
    pub fn to_canonical_string(&self) -> String {
        self.to_string()
    }
}

/// End of the run of ASCII digits starting at `from`.
fn scan_digits(bytes: &[u8], from: usize) -> usize {
    let run = bytes
        .get(from..)
        .unwrap_or_default()
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    from + run
}

/// Multiplies a big-endian decimal digit vector by a small factor in place.
fn mul_small(digits: &mut Vec<u8>, factor: u32) {
    let mut carry = 0u32;
    for d in digits.iter_mut().rev() {
        let v = u32::from(*d) * factor + carry;
        *d = (v % 10) as u8;
        carry = v / 10;
    }
    if carry == 0 {
        return;
    }
    let mut head = Vec::with_capacity(digits.len() + 4);
    while carry > 0 {
        head.push((carry % 10) as u8);
        carry /= 10;
    }
    head.reverse();
    head.extend_from_slice(digits);
    *digits = head;
}

/// `ceil(digits × 10^exp)` for a non-zero big-endian digit string without leading zeros,
/// or `None` if it does not fit a `u128`.
fn scale_to_nanos(digits: &[u8], exp: i64) -> Option<u128> {
    let n = i64::try_from(digits.len()).ok()?;
    let parse = |ds: &[u8]| -> Option<u128> {
        ds.iter()
            .try_fold(0u128, |acc, &d| acc.checked_mul(10)?.checked_add(u128::from(d)))
    };
    if exp >= 0 {
        // u128::MAX has 39 digits: anything longer overflows, and this bounds the loop below.
        if n.checked_add(exp)? > 39 {
            return None;
        }
        let mut v = parse(digits)?;
        for _ in 0..exp {
            v = v.checked_mul(10)?;
        }
        return Some(v);
    }
    let dropped = exp.unsigned_abs();
    let keep = usize::try_from(u64::try_from(n).ok()?.saturating_sub(dropped)).ok()?;
    if keep == 0 {
        // 0 < value < 1 nano: round up to the smallest representable amount.
        return Some(1);
    }
    let (whole, rest) = digits.split_at_checked(keep)?;
    let v = parse(whole)?;
    if rest.iter().any(|&d| d != 0) {
        v.checked_add(1)
    } else {
        Some(v)
    }
}

/// The input as echoed in errors: at most [`MAX_ERROR_INPUT`] bytes, cut on a char boundary.
fn excerpt(input: &str) -> String {
    if input.len() <= MAX_ERROR_INPUT {
        return input.to_owned();
    }
    let mut end = MAX_ERROR_INPUT;
    while !input.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", input.get(..end).unwrap_or_default())
}

const BINARY_SUFFIXES: [&str; 7] = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];

impl fmt::Display for Quantity {
    /// Go's `CanonicalizeBytes`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.nanos == 0 {
            return f.write_str("0");
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let magnitude = self.nanos.unsigned_abs();
        // BinarySI only for whole values of at least 1024; anything else prints as DecimalSI.
        if self.format == Format::BinarySI
            && magnitude >= 1024 * NANOS_PER_UNIT_U
            && magnitude.is_multiple_of(NANOS_PER_UNIT_U)
        {
            let mut units = magnitude / NANOS_PER_UNIT_U;
            let mut power = 0;
            while power < 6 && units.is_multiple_of(1024) {
                units /= 1024;
                power += 1;
            }
            return write!(f, "{sign}{units}{}", BINARY_SUFFIXES[power]);
        }
        // Strip factors of ten, then step the exponent down to a multiple of three. The
        // multiplier is at most the ten-power just removed, so it cannot overflow.
        let mut mantissa = magnitude;
        let mut exp: i32 = -9;
        while mantissa.is_multiple_of(10) {
            mantissa /= 10;
            exp += 1;
        }
        let down = exp.rem_euclid(3);
        mantissa = mantissa.saturating_mul(10u128.pow(down.unsigned_abs()));
        exp -= down;
        if self.format == Format::DecimalExponent {
            return if exp == 0 {
                write!(f, "{sign}{mantissa}")
            } else {
                write!(f, "{sign}{mantissa}e{exp}")
            };
        }
        let suffix = match exp {
            -9 => "n",
            -6 => "u",
            -3 => "m",
            0 => "",
            3 => "k",
            6 => "M",
            9 => "G",
            12 => "T",
            15 => "P",
            18 => "E",
            // No SI prefix beyond E: Go falls back to exponent notation.
            _ => return write!(f, "{sign}{mantissa}e{exp}"),
        };
        write!(f, "{sign}{mantissa}{suffix}")
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl Default for Quantity {
    fn default() -> Self {
        Quantity::zero()
    }
}

impl PartialEq for Quantity {
    fn eq(&self, other: &Self) -> bool {
        self.nanos == other.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Quantity {
    fn cmp(&self, other: &Self) -> Ordering {
        self.nanos.cmp(&other.nanos)
    }
}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // Value only, consistent with Eq.
        self.nanos.hash(state);
    }
}

impl Add for Quantity {
    type Output = Quantity;

    /// Sum; saturates at the representable range (see [`Quantity::checked_add`]).
    fn add(self, rhs: Self) -> Self {
        let nanos = self.nanos.saturating_add(rhs.nanos).max(-MAX_NANOS);
        Quantity {
            nanos,
            format: self.result_format(&rhs),
        }
    }
}

impl Sub for Quantity {
    type Output = Quantity;

    /// Difference; saturates at the representable range (see [`Quantity::checked_sub`]).
    fn sub(self, rhs: Self) -> Self {
        let nanos = self.nanos.saturating_sub(rhs.nanos).max(-MAX_NANOS);
        Quantity {
            nanos,
            format: self.result_format(&rhs),
        }
    }
}

impl AddAssign for Quantity {
    fn add_assign(&mut self, rhs: Self) {
        *self = *self + rhs;
    }
}

impl SubAssign for Quantity {
    fn sub_assign(&mut self, rhs: Self) {
        *self = *self - rhs;
    }
}

impl Neg for Quantity {
    type Output = Quantity;

    fn neg(self) -> Self {
        // nanos is never i128::MIN, so this cannot overflow.
        Quantity {
            nanos: -self.nanos,
            format: self.format,
        }
    }
}

impl Sum for Quantity {
    fn sum<I: Iterator<Item = Quantity>>(iter: I) -> Self {
        iter.fold(Quantity::zero(), Add::add)
    }
}

impl<'a> Sum<&'a Quantity> for Quantity {
    fn sum<I: Iterator<Item = &'a Quantity>>(iter: I) -> Self {
        iter.fold(Quantity::zero(), |acc, q| acc + *q)
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(QuantityVisitor)
    }
}

/// Accepts what Go's `UnmarshalJSON` accepts: a string (trimmed), a bare number, or null (zero).
struct QuantityVisitor;

impl<'de> Visitor<'de> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes quantity (string or number)")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
        Quantity::parse(v.trim()).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
        Ok(Quantity::from_int(v, Format::DecimalSI))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
        Ok(Quantity {
            nanos: i128::from(v) * NANOS_PER_UNIT,
            format: Format::DecimalSI,
        })
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<Quantity, E> {
        v.checked_mul(NANOS_PER_UNIT)
            .filter(|n| *n != i128::MIN)
            .map(|nanos| Quantity {
                nanos,
                format: Format::DecimalSI,
            })
            .ok_or_else(|| E::custom(QuantityError::OutOfRange { input: v.to_string() }))
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<Quantity, E> {
        match i128::try_from(v) {
            Ok(v) => self.visit_i128(v),
            Err(_) => Err(E::custom(QuantityError::OutOfRange { input: v.to_string() })),
        }
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
        if !v.is_finite() {
            return Err(E::invalid_value(de::Unexpected::Float(v), &self));
        }
        // Rust prints the shortest round-trip decimal without an exponent: 1.5 → "1.5".
        Quantity::parse(&v.to_string()).map_err(E::custom)
    }

    fn visit_unit<E: de::Error>(self) -> Result<Quantity, E> {
        Ok(Quantity::zero())
    }

    fn visit_none<E: de::Error>(self) -> Result<Quantity, E> {
        Ok(Quantity::zero())
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Quantity, D::Error> {
        Quantity::deserialize(deserializer)
    }
}

impl TryFrom<&K8sQuantity> for Quantity {
    type Error = QuantityError;

    /// Parses the wire string; surrounding whitespace is ignored, as Go's JSON decoding does.
    fn try_from(q: &K8sQuantity) -> Result<Self, Self::Error> {
        Quantity::parse(q.0.trim())
    }
}

impl TryFrom<K8sQuantity> for Quantity {
    type Error = QuantityError;

    fn try_from(q: K8sQuantity) -> Result<Self, Self::Error> {
        Quantity::try_from(&q)
    }
}

impl From<&Quantity> for K8sQuantity {
    /// The canonical string.
    fn from(q: &Quantity) -> Self {
        K8sQuantity(q.to_string())
    }
}

impl From<Quantity> for K8sQuantity {
    fn from(q: Quantity) -> Self {
        K8sQuantity::from(&q)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap_or_else(|e| panic!("parse {s:?}: {e}"))
    }

    /// Go test helper `decQuantity(m, e, _)`: m × 10^e, in nanos.
    fn dec(m: i128, e: i32) -> i128 {
        let shift = e + 9;
        assert!(shift >= 0, "finer than nano");
        m * 10i128.pow(shift.unsigned_abs())
    }

    const GIB: i128 = 1024 * 1024 * 1024;
    const MAX_ALLOWED: i128 = i64::MAX as i128 * NANOS_PER_UNIT;

    #[test]
    fn parse_to_canonical() {
        let table: &[(&str, &str)] = &[
            // Cases from the brief / quantity.go doc comment.
            ("0", "0"),
            ("1", "1"),
            ("1.5", "1500m"),
            ("1.5Gi", "1536Mi"),
            ("2.5Gi", "2560Mi"),
            ("0.5Gi", "512Mi"),
            ("100m", "100m"),
            ("1000m", "1"),
            ("1e3", "1e3"),
            ("1E6", "1e6"),
            ("12E6", "12e6"),
            ("1k", "1k"),
            ("1000k", "1M"),
            ("1Ki", "1Ki"),
            ("1024Ki", "1Mi"),
            ("0.5Ki", "512"),
            ("1024", "1024"),
            ("1500", "1500"),
            ("2000000", "2M"),
            ("0.1m", "100u"),
            ("100n", "100n"),
            ("1.5e3", "1500"),
            ("-1", "-1"),
            ("+5", "5"),
            ("1n", "1n"),
            ("1.1n", "2n"),
            ("9223372036854775807", "9223372036854775807"),
            // Decimal values are not capped in Go ("12E" stays 12e18).
            ("10E", "10E"),
            ("12E", "12E"),
            (".5", "500m"),
            ("5.", "5"),
            ("-0", "0"),
            ("00", "0"),
            ("01", "1"),
            ("1.0", "1"),
            ("0Ki", "0"),
            ("0e3", "0"),
            // TestQuantityString: alternate spellings → canonical.
            ("1Gi", "1Gi"),
            ("1024Mi", "1Gi"),
            ("300Mi", "300Mi"),
            ("307200Ki", "300Mi"),
            ("6Ki", "6Ki"),
            ("1001Gi", "1001Gi"),
            ("1025024Mi", "1001Gi"),
            ("1Ti", "1Ti"),
            ("1024Gi", "1Ti"),
            ("5000m", "5"),
            ("0.5", "500m"),
            ("1G", "1G"),
            ("1000M", "1G"),
            ("0.001T", "1G"),
            ("1m", "1m"),
            ("1000u", "1m"),
            ("80m", "80m"),
            ("1080m", "1080m"),
            ("1.08", "1080m"),
            ("1080000000n", "1080m"),
            ("300M", "300M"),
            ("1T", "1T"),
            ("1E", "1E"),
            ("1000E", "1e21"),
            ("5000E", "5e21"),
            ("1000000E", "1e24"),
            ("1234567M", "1234567M"),
            ("1234567m", "1234567m"),
            ("3k", "3k"),
            ("1025", "1025"),
            ("1e9", "1e9"),
            (".001e12", "1e9"),
            ("1e-3", "1e-3"),
            ("0.001e0", "1e-3"),
            ("1e-9", "1e-9"),
            ("1000e-12", "1e-9"),
            ("80e-3", "80e-3"),
            ("300e6", "300e6"),
            ("1e12", "1e12"),
            ("3e3", "3e3"),
            ("1080n", "1080n"),
            ("1u", "1u"),
            ("80u", "80u"),
            ("1080u", "1080u"),
            // TestQuantityParseEmit.
            ("1Mi", "1Mi"),
            (".001Ki", "1024m"),
            (".000001Ki", "1024u"),
            (".000000001Ki", "1024n"),
            (".000000000001Ki", "2n"),
            // Rounding and saturation (TestQuantityParse values, printed).
            ("3.001n", "4n"),
            ("1.1E-9", "2e-9"),
            ("0.9n", "1n"),
            ("0.0000000001", "1n"),
            ("0.00000012345", "124n"),
            ("9Ei", "9223372036854775807"),
            ("8Ei", "9223372036854775807"),
            ("9223372036854775807Ki", "9223372036854775807"),
            ("7Ei", "7Ei"),
            // Exact values print with the largest exponent that loses nothing.
            ("1.5Ki", "1536"),
            ("1025Ki", "1025Ki"),
            ("1.1Ki", "1126400m"),
            ("100.035Ki", "102435840m"),
            ("0.05Gi", "53687091200m"),
            ("1.2e3", "1200"),
            ("1.3E+6", "1300e3"),
            ("0.5e0", "500e-3"),
            ("1.01E", "1010P"),
            ("2.5P", "2500T"),
            ("40.1T", "40100G"),
            ("5.444T", "5444G"),
            ("6.987654321G", "6987654321"),
            ("7.123456M", "7123456"),
            ("8.1k", "8100"),
            ("9.01", "9010m"),
            ("10.035M", "10035k"),
            ("100.035k", "100035"),
            ("50k", "50k"),
            ("40T", "40T"),
            ("1.G", "1G"),
            ("-1.5Gi", "-1536Mi"),
            ("-0.5", "-500m"),
            ("-1.1n", "-2n"),
            ("-9Ei", "-9223372036854775807"),
            ("1e4294967296", "1"),
        ];
        assert!(table.len() >= 60);
        for (input, want) in table {
            let parsed = q(input);
            assert_eq!(parsed.to_string(), *want, "canonical of {input:?}");
            assert_eq!(parsed.to_canonical_string(), *want);
            // The canonical form re-parses to the same value and prints identically.
            let again = q(want);
            assert_eq!(again, parsed, "value of {want:?}");
            assert_eq!(
                again.to_string(),
                *want,
                "canonical is a fixed point for {want:?}"
            );
        }
        // quantity_test.go also checks every negative spelling.
        for (input, want) in table {
            if *want == "0" || input.starts_with(['-', '+']) {
                continue;
            }
            assert_eq!(
                q(&format!("-{input}")).to_string(),
                format!("-{want}"),
                "-{input}"
            );
            assert_eq!(q(&format!("+{input}")).to_string(), *want, "+{input}");
        }
    }

    #[test]
    fn parse_values_and_formats() {
        use Format::*;
        // TestQuantityParse (value as decQuantity(m, e), format).
        let table: &[(&str, i128, Format)] = &[
            ("0", 0, DecimalSI),
            ("0n", 0, DecimalSI),
            ("0u", 0, DecimalSI),
            ("0m", 0, DecimalSI),
            ("0Ki", 0, BinarySI),
            ("0k", 0, DecimalSI),
            ("0Mi", 0, BinarySI),
            ("0M", 0, DecimalSI),
            ("0Gi", 0, BinarySI),
            ("0G", 0, DecimalSI),
            ("0Ti", 0, BinarySI),
            ("0T", 0, DecimalSI),
            ("1", dec(1, 0), DecimalSI),
            ("1Ki", dec(1024, 0), BinarySI),
            ("8Ki", dec(8 * 1024, 0), BinarySI),
            ("7Mi", dec(7 * 1024 * 1024, 0), BinarySI),
            ("6Gi", dec(6 * GIB, 0), BinarySI),
            ("5Ti", dec(5 * GIB * 1024, 0), BinarySI),
            ("4Pi", dec(4 * GIB * 1024 * 1024, 0), BinarySI),
            ("3Ei", dec(3 * GIB * GIB, 0), BinarySI),
            ("10Ti", dec(10 * GIB * 1024, 0), BinarySI),
            ("100Ti", dec(100 * GIB * 1024, 0), BinarySI),
            ("5n", dec(5, -9), DecimalSI),
            ("4u", dec(4, -6), DecimalSI),
            ("3m", dec(3, -3), DecimalSI),
            ("9", dec(9, 0), DecimalSI),
            ("8k", dec(8, 3), DecimalSI),
            ("50k", dec(5, 4), DecimalSI),
            ("7M", dec(7, 6), DecimalSI),
            ("6G", dec(6, 9), DecimalSI),
            ("5T", dec(5, 12), DecimalSI),
            ("40T", dec(4, 13), DecimalSI),
            ("300T", dec(3, 14), DecimalSI),
            ("2P", dec(2, 15), DecimalSI),
            ("1E", dec(1, 18), DecimalSI),
            ("1E-3", dec(1, -3), DecimalExponent),
            ("1e3", dec(1, 3), DecimalExponent),
            ("1E6", dec(1, 6), DecimalExponent),
            ("1e9", dec(1, 9), DecimalExponent),
            ("1E12", dec(1, 12), DecimalExponent),
            ("1e15", dec(1, 15), DecimalExponent),
            ("1E18", dec(1, 18), DecimalExponent),
            ("1e14", dec(1, 14), DecimalExponent),
            ("1e13", dec(1, 13), DecimalExponent),
            ("100.035k", dec(100035, 0), DecimalSI),
            ("0.001", dec(1, -3), DecimalSI),
            ("0.0005k", dec(5, -1), DecimalSI),
            ("0.005", dec(5, -3), DecimalSI),
            ("0.05", dec(5, -2), DecimalSI),
            ("0.5", dec(5, -1), DecimalSI),
            ("0.00050k", dec(5, -1), DecimalSI),
            ("0.00500", dec(5, -3), DecimalSI),
            ("0.05000", dec(5, -2), DecimalSI),
            ("0.50000", dec(5, -1), DecimalSI),
            ("0.5e0", dec(5, -1), DecimalExponent),
            ("0.5e-1", dec(5, -2), DecimalExponent),
            ("0.5e-2", dec(5, -3), DecimalExponent),
            ("10.035M", dec(10035, 3), DecimalSI),
            ("1.2e3", dec(12, 2), DecimalExponent),
            ("1.3E+6", dec(13, 5), DecimalExponent),
            ("1.40e9", dec(14, 8), DecimalExponent),
            ("1.53E12", dec(153, 10), DecimalExponent),
            ("1.6e15", dec(16, 14), DecimalExponent),
            ("1.7E18", dec(17, 17), DecimalExponent),
            ("9.01", dec(901, -2), DecimalSI),
            ("8.1k", dec(81, 2), DecimalSI),
            ("7.123456M", dec(7123456, 0), DecimalSI),
            ("6.987654321G", dec(6987654321, 0), DecimalSI),
            ("5.444T", dec(5444, 9), DecimalSI),
            ("40.1T", dec(401, 11), DecimalSI),
            ("300.2T", dec(3002, 11), DecimalSI),
            ("2.5P", dec(25, 14), DecimalSI),
            ("1.01E", dec(101, 16), DecimalSI),
            ("3.001n", dec(4, -9), DecimalSI),
            ("1.1E-9", dec(2, -9), DecimalExponent),
            ("0.0000000001", dec(1, -9), DecimalSI),
            ("0.0000000005", dec(1, -9), DecimalSI),
            ("0.00000000050", dec(1, -9), DecimalSI),
            ("0.5e-9", dec(1, -9), DecimalExponent),
            ("0.9n", dec(1, -9), DecimalSI),
            ("0.00000012345", dec(124, -9), DecimalSI),
            ("0.00000012354", dec(124, -9), DecimalSI),
            ("9Ei", MAX_ALLOWED, BinarySI),
            ("9223372036854775807Ki", MAX_ALLOWED, BinarySI),
            ("12E", dec(12, 18), DecimalSI),
            ("100.035Ki", dec(10243584, -2), BinarySI),
            ("0.5Mi", dec(512 * 1024, 0), BinarySI),
            ("0.05Gi", dec(536870912, -1), BinarySI),
            ("0.025Ti", dec(274877906944, -1), BinarySI),
            // Below one unit a binary value becomes DecimalSI.
            ("0.000000000001Ki", dec(2, -9), DecimalSI),
            ("0.5Ki", dec(512, 0), BinarySI),
            (".001", dec(1, -3), DecimalSI),
            (".0001k", dec(100, -3), DecimalSI),
            ("1.", dec(1, 0), DecimalSI),
            ("1.G", dec(1, 9), DecimalSI),
        ];
        for (input, nanos, format) in table {
            let got = q(input);
            assert_eq!((got.nanos(), got.format()), (*nanos, *format), "{input}");
            // As in Go's test: "-" negates the value (rounded on the magnitude), same format;
            // "+" changes nothing.
            let neg = q(&format!("-{input}"));
            assert_eq!((neg.nanos(), neg.format()), (-*nanos, *format), "-{input}");
            let pos = q(&format!("+{input}"));
            assert_eq!((pos.nanos(), pos.format()), (*nanos, *format), "+{input}");
        }
    }

    /// `digits e exp` as nanos, for the records of Go's decode corpus.
    fn corpus_value(v: &str) -> i128 {
        if v == "0" {
            return 0;
        }
        let (m, e) = v.split_once('e').expect("corpus value");
        dec(m.parse().expect("mantissa"), e.parse().expect("exponent"))
    }

    #[test]
    fn go_decode_corpus_records() {
        // Records of kubernetes staging/.../resource/testdata/quantity_decode_corpus.json
        // (ParseQuantity of the v1.37.0 release): input, value as <digits>e<exp>, format.
        let records: &[(&str, &str, &str)] = &[
            ("01", "1e0", "DecimalSI"),
            ("01Ki", "1024e0", "BinarySI"),
            ("01Ei", "1152921504606846976e0", "BinarySI"),
            ("01e+21", "1e21", "DecimalExponent"),
            ("01e-1000", "1e-9", "DecimalExponent"),
            ("1e03", "1e3", "DecimalExponent"),
            ("1e-4294967297", "1e-1", "DecimalExponent"),
            ("1e-4294967296", "1e0", "DecimalExponent"),
            ("1e-330", "1e-9", "DecimalExponent"),
            ("1e-10", "1e-9", "DecimalExponent"),
            ("1e19", "1e19", "DecimalExponent"),
            ("1e21", "1e21", "DecimalExponent"),
            ("1e4294967295", "1e-1", "DecimalExponent"),
            ("1e4294967296", "1e0", "DecimalExponent"),
            ("1e4294967297", "1e1", "DecimalExponent"),
            ("1e8589934592", "1e0", "DecimalExponent"),
            ("5Ki", "512e1", "BinarySI"),
            ("5Pi", "562949953421312e1", "BinarySI"),
            ("5e-10", "1e-9", "DecimalExponent"),
            ("5e-9", "5e-9", "DecimalExponent"),
            ("5e4294967295", "5e-1", "DecimalExponent"),
            ("7Ei", "8070450532247928832e0", "BinarySI"),
            ("7e-18", "1e-9", "DecimalExponent"),
            ("-9223372036854775806", "-9223372036854775806e0", "DecimalSI"),
            ("-9223372036854775806n", "-9223372036854775806e-9", "DecimalSI"),
            ("-9223372036854775806k", "-9223372036854775806e3", "DecimalSI"),
            ("-9223372036854775806Ki", "-9223372036854775807e0", "BinarySI"),
            ("-9223372036854775806Ei", "-9223372036854775807e0", "BinarySI"),
            ("-9223372036854775806e-19", "-922337204e-9", "DecimalExponent"),
            ("-9223372036854775806e-18", "-9223372037e-9", "DecimalExponent"),
            (
                "-9223372036854775806e-10",
                "-922337203685477581e-9",
                "DecimalExponent",
            ),
            (
                "-9223372036854775806e-1",
                "-9223372036854775806e-1",
                "DecimalExponent",
            ),
            (
                "-9223372036854775806e10",
                "-9223372036854775806e10",
                "DecimalExponent",
            ),
            (
                "-9223372036854775806e4294967296",
                "-9223372036854775806e0",
                "DecimalExponent",
            ),
            ("-9223372036854775807m", "-9223372036854775807e-3", "DecimalSI"),
            ("-9223372036854775807G", "-9223372036854775807e9", "DecimalSI"),
            ("-9223372036854775807Ki", "-9223372036854775807e0", "BinarySI"),
            ("-9223372036854775807e-1000", "-1e-9", "DecimalExponent"),
            ("-9223372036854775808", "-9223372036854775808e0", "DecimalSI"),
            ("-9223372036854775808u", "-9223372036854775808e-6", "DecimalSI"),
            ("-9223372036854775808Ki", "-9223372036854775807e0", "BinarySI"),
            (
                "-9223372036854775808e-9",
                "-9223372036854775808e-9",
                "DecimalExponent",
            ),
            ("-18446744073709551615", "-18446744073709551615e0", "DecimalSI"),
            ("-18446744073709551615M", "-18446744073709551615e6", "DecimalSI"),
            ("-18446744073709551615Ti", "-9223372036854775807e0", "BinarySI"),
            ("-18446744073709551615e-19", "-1844674408e-9", "DecimalExponent"),
            (
                "-18446744073709551615e-10",
                "-1844674407370955162e-9",
                "DecimalExponent",
            ),
            (
                "-18446744073709551615e-4294967297",
                "-18446744073709551615e-1",
                "DecimalExponent",
            ),
        ];
        for (input, value, format) in records {
            let got = q(input);
            assert_eq!(got.nanos(), corpus_value(value), "{input}");
            assert_eq!(got.format().as_str(), *format, "{input}");
        }
        // Decimal values beyond the i128 nano range (Go keeps them, or hangs on them) are
        // rejected quickly rather than approximated.
        for input in [
            "1e2147483647",
            "1e-2147483649",
            "-9223372036854775807E",
            "-18446744073709551615e21",
            "-9223372036854775806e-2147483649",
            "1e30",
        ] {
            assert!(
                matches!(Quantity::parse(input), Err(QuantityError::OutOfRange { .. })),
                "{input}"
            );
        }
        // Zero with any exponent is zero.
        for input in ["0e2147483647", "0e-2147483648", "0.0e8589934592", "0Ei", "0.0Pi"] {
            assert!(q(input).is_zero(), "{input}");
        }
    }

    #[test]
    fn invalid_inputs() {
        let num = |s: &str| QuantityError::InvalidNumber { input: s.to_owned() };
        let suf = |s: &str, suffix: &str| QuantityError::UnknownSuffix {
            input: s.to_owned(),
            suffix: suffix.to_owned(),
        };
        let table: Vec<(&str, QuantityError)> = vec![
            ("", QuantityError::Empty),
            // quantity_test.go's invalid list.
            ("1.1.M", num("1.1.M")),
            ("1+1.0M", num("1+1.0M")),
            ("0.1mi", suf("0.1mi", "mi")),
            ("0.1am", suf("0.1am", "am")),
            ("aoeu", num("aoeu")),
            (".5i", suf(".5i", "i")),
            ("1i", suf("1i", "i")),
            ("-3.01i", suf("-3.01i", "i")),
            ("-3.01e-", suf("-3.01e-", "e-")),
            (" 1", num(" 1")),
            ("1 ", suf("1 ", " ")),
            // Bare signs, bare dots and suffixes without a number.
            ("-", num("-")),
            ("+", num("+")),
            (".", num(".")),
            ("-.", num("-.")),
            ("+-1", num("+-1")),
            ("--1", num("--1")),
            ("Ki", num("Ki")),
            ("m", num("m")),
            ("e3", num("e3")),
            ("1..5", num("1..5")),
            ("1.5.", num("1.5.")),
            ("1-", num("1-")),
            ("１", num("１")),
            // Unknown suffixes (case matters, no byte units).
            ("1K", suf("1K", "K")),
            ("1ki", suf("1ki", "ki")),
            ("1KiB", suf("1KiB", "KiB")),
            ("1KB", suf("1KB", "KB")),
            ("1e", suf("1e", "e")),
            ("1E+", suf("1E+", "E+")),
            ("1e1.5", suf("1e1.5", "e1.5")),
            ("1e 3", suf("1e 3", "e 3")),
            (
                "1e99999999999999999999",
                suf("1e99999999999999999999", "e99999999999999999999"),
            ),
            ("1é", suf("1é", "é")),
            ("1mm", suf("1mm", "mm")),
        ];
        for (input, want) in table {
            assert_eq!(Quantity::parse(input), Err(want), "{input:?}");
        }
        assert!(matches!(
            "1e40".parse::<Quantity>(),
            Err(QuantityError::OutOfRange { .. })
        ));
    }

    #[test]
    fn error_messages_echo_a_bounded_input() {
        assert_eq!(QuantityError::Empty.to_string(), "empty quantity");
        assert_eq!(
            Quantity::parse("1KiB").map_err(|e| e.to_string()),
            Err("invalid quantity \"1KiB\": unknown suffix \"KiB\"".to_owned())
        );
        let long = format!("x{}", "é".repeat(100));
        let Err(QuantityError::InvalidNumber { input }) = Quantity::parse(&long) else {
            panic!("expected InvalidNumber");
        };
        assert!(input.len() <= MAX_ERROR_INPUT + '…'.len_utf8());
        assert!(input.ends_with('…'));
    }

    #[test]
    fn comparisons_ignore_format() {
        assert_eq!(q("1Ki"), q("1024"));
        assert_eq!(q("1Ki"), q("1.024k"));
        assert_eq!(q("1k"), q("1e3"));
        assert_eq!(q("1000m"), q("1"));
        assert_eq!(q("0Ki"), q("0"));
        assert_eq!(q("-0"), Quantity::zero());
        assert!(q("100m") > q("50m"));
        assert!(q("50m") < q("100m"));
        assert!(q("10000T") > q("100Gi"));
        assert!(q("1Gi") > q("1G"));
        assert!(q("999999999n") < q("1"));
        assert!(q("-1") < q("0.001m"));
        assert!(q("1.1n") > q("1n"));
        assert_eq!(q("1.1n"), q("2n"));
        let mut max = [q("1Gi"), q("1100M"), q("1e9")];
        max.sort();
        assert_eq!(max.map(|x| x.to_string()), ["1e9", "1Gi", "1100M"]);
        let set: HashSet<Quantity> = ["1Ki", "1024", "1.024k", "1024000m", "2Ki"]
            .map(q)
            .into_iter()
            .collect();
        assert_eq!(set.len(), 2);
    }

    #[test]
    fn add_sub_format_rules() {
        // TestQuantityAddZeroPreservesSuffix / TestQuantitySubZeroPreservesSuffix.
        for s in ["100m", "1Gi"] {
            let v = q(s);
            assert_eq!((v + Quantity::zero()).to_string(), s);
            assert_eq!((Quantity::zero() + v).to_string(), s);
            assert_eq!((v - Quantity::zero()).to_string(), s);
            assert_eq!((Quantity::zero() - v).to_string(), (-v).to_string());
            assert_eq!((Quantity::zero() - v).to_string(), format!("-{s}"));
        }
        // Left format wins unless the left value is zero.
        assert_eq!((q("1Ki") + q("1Ki")).to_string(), "2Ki");
        assert_eq!((q("1Ki") + q("1")).to_string(), "1025");
        assert_eq!((q("1Ki") + q("1k")).to_string(), "2024");
        assert_eq!((q("1Ki") + q("1k")).format(), Format::BinarySI);
        assert_eq!((q("1k") + q("24")).to_string(), "1024");
        assert_eq!((q("1k") + q("1Ki")).to_string(), "2024");
        assert_eq!((q("1Mi") - q("1Ki")).to_string(), "1023Ki");
        assert_eq!((q("1e3") + q("1k")).to_string(), "2e3");
        assert_eq!((q("0") + q("1e3")).to_string(), "1e3");
        assert_eq!((q("0Ki") + q("1k")).to_string(), "1k");
        assert_eq!((q("1.5") - q("500m")).to_string(), "1");
        assert_eq!((q("500m") - q("1.5")).to_string(), "-1");
        assert_eq!(
            q("1").checked_add(q("500m")).map(|x| x.to_string()),
            Some("1500m".to_owned())
        );
        assert_eq!(
            q("1Gi").checked_sub(q("2Gi")).map(|x| x.to_string()),
            Some("-1Gi".to_owned())
        );
        let mut acc = Quantity::zero();
        acc += q("1Gi");
        acc += q("512Mi");
        acc -= q("1Mi");
        assert_eq!(acc.to_string(), "1535Mi");
        let total: Quantity = ["100m", "200m", "700m"].map(q).iter().sum();
        assert_eq!(total.to_string(), "1");
        let total: Quantity = ["1Gi", "1Gi"].map(q).into_iter().sum();
        assert_eq!(total.to_string(), "2Gi");
        // Arithmetic is not capped: 4Ei + 4Ei is exactly 2^63.
        assert_eq!((q("4Ei") + q("4Ei")).to_string(), "8Ei");
        // The parse cap (2^63-1) plus one is exactly 8Ei again.
        assert_eq!((q("8Ei") + q("1")).to_string(), "8Ei");
        assert_eq!((q("8Ei") + q("2")).to_string(), "9223372036854775809");
    }

    #[test]
    fn overflow_is_checked_or_saturating() {
        let big = Quantity::from_nanos(i128::MAX, Format::DecimalSI);
        assert_eq!(big.checked_add(q("1n")), None);
        assert_eq!((-big).checked_sub(q("1n")), None);
        assert_eq!(big.checked_add(-big), Some(Quantity::zero()));
        assert_eq!((big + big).nanos(), i128::MAX);
        assert_eq!(((-big) - big).nanos(), -i128::MAX);
        assert_eq!(
            Quantity::from_nanos(i128::MIN, Format::DecimalSI).nanos(),
            -i128::MAX
        );
        assert_eq!(big.value_ceil(), i64::MAX);
        assert_eq!((-big).millis_ceil(), i64::MIN);
        assert_eq!(big.as_i64_exact(), None);
        // Past Ei the BinarySI form keeps counting in Ei.
        let huge = Quantity::from_nanos(dec(1i128 << 70, 0), Format::BinarySI);
        assert_eq!(huge.to_string(), "1024Ei");
        // Parsing it back applies the BinarySI cap, as Go's parser would.
        assert_eq!(q(&huge.to_string()).to_string(), "9223372036854775807");
        // Large decimal values print with an exponent past E.
        assert_eq!(big.to_string(), "170141183460469231731687303715884105727n");
    }

    #[test]
    fn clamp_at_zero() {
        assert_eq!(q("1Gi").saturating_sub_floor_zero(q("2Gi")), Quantity::zero());
        assert_eq!(q("1Gi").saturating_sub_floor_zero(q("2Gi")).to_string(), "0");
        assert_eq!(q("2Gi").saturating_sub_floor_zero(q("1Gi")).to_string(), "1Gi");
        assert_eq!(q("1").saturating_sub_floor_zero(q("1")).to_string(), "0");
        assert_eq!(q("1500m").saturating_sub_floor_zero(q("1")).to_string(), "500m");
        assert_eq!(q("-1").saturating_sub_floor_zero(q("-3")).to_string(), "2");
        assert_eq!(
            q("0").saturating_sub_floor_zero(q("4Gi")).format(),
            Format::BinarySI
        );
    }

    #[test]
    fn accessors_round_away_from_zero() {
        assert_eq!(q("500m").value_ceil(), 1);
        assert_eq!(q("1").value_ceil(), 1);
        assert_eq!(q("1001m").value_ceil(), 2);
        assert_eq!(q("1n").value_ceil(), 1);
        assert_eq!(q("-500m").value_ceil(), -1);
        assert_eq!(q("0").value_ceil(), 0);
        assert_eq!(q("1Gi").value_ceil(), 1 << 30);
        assert_eq!(q("9Ei").value_ceil(), i64::MAX);
        assert_eq!(q("10E").value_ceil(), i64::MAX);
        assert_eq!(q("-10E").value_ceil(), i64::MIN);
        assert_eq!(q("1.5").millis_ceil(), 1500);
        assert_eq!(q("1n").millis_ceil(), 1);
        assert_eq!(q("-1n").millis_ceil(), -1);
        assert_eq!(q("2").millis_ceil(), 2000);
        assert_eq!(q("1.0001m").millis_ceil(), 2);
        assert_eq!(q("9Ei").millis_ceil(), i64::MAX);
        assert_eq!(q("1Ki").as_i64_exact(), Some(1024));
        assert_eq!(q("-3").as_i64_exact(), Some(-3));
        assert_eq!(q("1.5").as_i64_exact(), None);
        assert_eq!(q("9223372036854775807").as_i64_exact(), Some(i64::MAX));
        assert_eq!(q("9223372036854775808").as_i64_exact(), None);
        assert_eq!(q("-9223372036854775808").as_i64_exact(), Some(i64::MIN));
        assert_eq!(q("1.5").nanos(), 1_500_000_000);
        assert!(q("-1n").is_negative() && !q("0").is_negative() && q("0").is_zero());
    }

    #[test]
    fn constructors() {
        // TestNewSet / TestMilliNewSet.
        assert_eq!(Quantity::from_int(1, Format::DecimalSI).to_string(), "1");
        assert_eq!(Quantity::from_int(1000, Format::DecimalSI).to_string(), "1k");
        assert_eq!(
            Quantity::from_int(1234000, Format::DecimalSI).to_string(),
            "1234k"
        );
        assert_eq!(Quantity::from_int(1024, Format::BinarySI).to_string(), "1Ki");
        assert_eq!(
            Quantity::from_int(1000000, Format::DecimalExponent).to_string(),
            "1e6"
        );
        assert_eq!(
            Quantity::from_int(1024 * 1024, Format::BinarySI).to_string(),
            "1Mi"
        );
        assert_eq!(
            Quantity::from_int(i64::MIN, Format::DecimalSI).to_string(),
            "-9223372036854775808"
        );
        assert_eq!(Quantity::from_milli(1, Format::DecimalSI).to_string(), "1m");
        assert_eq!(Quantity::from_milli(1000, Format::DecimalSI).to_string(), "1");
        assert_eq!(
            Quantity::from_milli(1234000, Format::DecimalSI).to_string(),
            "1234"
        );
        assert_eq!(Quantity::from_milli(1024, Format::BinarySI).to_string(), "1024m");
        assert_eq!(
            Quantity::from_milli(1000000, Format::DecimalExponent).to_string(),
            "1e3"
        );
        assert_eq!(
            Quantity::from_milli(1024 * 1024, Format::BinarySI).to_string(),
            "1048576m"
        );
        assert_eq!(Quantity::from_nanos(1, Format::DecimalSI).to_string(), "1n");
        assert_eq!(Quantity::default(), Quantity::zero());
        assert_eq!(Quantity::zero().to_string(), "0");
        assert_eq!(q("1Gi").with_format(Format::DecimalSI).to_string(), "1073741824");
        assert_eq!(
            q("1Gi").with_format(Format::DecimalExponent).to_string(),
            "1073741824"
        );
        assert_eq!(q("1G").with_format(Format::BinarySI).to_string(), "1000000000");
        assert_eq!(Format::BinarySI.to_string(), "BinarySI");
    }

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Holder {
        q: Quantity,
        #[serde(default)]
        opt: Option<Quantity>,
    }

    #[test]
    fn serde_round_trips() {
        let h: Holder = serde_json::from_str(r#"{"q": "1.5Gi"}"#).expect("string");
        assert_eq!(h.q.to_string(), "1536Mi");
        assert_eq!(h.opt, None);
        assert_eq!(
            serde_json::to_string(&h).expect("ser"),
            r#"{"q":"1536Mi","opt":null}"#
        );
        let back: Holder = serde_json::from_str(&serde_json::to_string(&h).expect("ser")).expect("de");
        assert_eq!(back, h);

        let cases: &[(&str, &str)] = &[
            (r#""100m""#, "100m"),
            (r#"" 1""#, "1"),
            (r#""1 ""#, "1"),
            ("1", "1"),
            (" 1", "1"),
            ("10", "10"),
            ("-1", "-1"),
            ("2048", "2048"),
            ("18446744073709551615", "18446744073709551615"),
            ("-9223372036854775808", "-9223372036854775808"),
            ("1.5", "1500m"),
            ("0.25", "250m"),
            ("-0.5", "-500m"),
            ("1e3", "1k"),
            ("null", "0"),
        ];
        for (json, want) in cases {
            let got: Quantity = serde_json::from_str(json).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(got.to_string(), *want, "{json}");
            let ser = serde_json::to_string(&got).expect("ser");
            assert_eq!(ser, format!("\"{want}\""));
            let again: Quantity = serde_json::from_str(&ser).expect("de");
            assert_eq!(again, got);
        }
        let h: Holder = serde_json::from_str(r#"{"q": 4, "opt": "1Ki"}"#).expect("int");
        assert_eq!(
            (h.q.to_string(), h.opt.map(|o| o.to_string())),
            ("4".into(), Some("1Ki".into()))
        );

        for bad in [r#""abc""#, "true", "[]", "{}", r#""""#, r#""1KiB""#] {
            assert!(serde_json::from_str::<Quantity>(bad).is_err(), "{bad}");
        }
        let err = serde_json::from_str::<Quantity>(r#""1KiB""#)
            .expect_err("bad suffix")
            .to_string();
        assert!(err.contains("unknown suffix \"KiB\""), "{err}");
    }

    #[test]
    fn k8s_openapi_conversions() {
        let wire = K8sQuantity("2.5Gi".to_owned());
        let ours = Quantity::try_from(&wire).expect("parse");
        assert_eq!(ours, q("2560Mi"));
        assert_eq!(K8sQuantity::from(&ours), K8sQuantity("2560Mi".to_owned()));
        assert_eq!(K8sQuantity::from(ours).0, "2560Mi");
        assert_eq!(Quantity::try_from(K8sQuantity(" 1 ".to_owned())), Ok(q("1")));
        assert_eq!(
            Quantity::try_from(&K8sQuantity(String::new())),
            Err(QuantityError::Empty)
        );
        assert!(matches!(
            Quantity::try_from(&K8sQuantity("1x".to_owned())),
            Err(QuantityError::UnknownSuffix { .. })
        ));
    }

    /// Parsing never panics; whatever parses has a canonical form that is a fixed point.
    fn check_total(input: &str) {
        let Ok(parsed) = Quantity::parse(input) else {
            return;
        };
        let canonical = parsed.to_string();
        let again = Quantity::parse(&canonical).unwrap_or_else(|e| panic!("{input:?} → {canonical:?}: {e}"));
        assert_eq!(again, parsed, "{input:?} → {canonical:?}");
        assert_eq!(again.to_string(), canonical, "{input:?}");
        let _ = (parsed.value_ceil(), parsed.millis_ceil(), parsed.as_i64_exact());
        let _ = (
            parsed + parsed,
            parsed - again,
            parsed.saturating_sub_floor_zero(again),
        );
    }

    #[test]
    fn garbage_never_panics() {
        const PIECES: &[&str] = &[
            "0",
            "1",
            "2",
            "5",
            "9",
            "00",
            "000000000",
            "999999999999",
            ".",
            ".",
            "+",
            "-",
            "e",
            "E",
            "i",
            "n",
            "u",
            "m",
            "k",
            "K",
            "M",
            "G",
            "T",
            "P",
            "Ki",
            "Mi",
            "Gi",
            "Ti",
            "Pi",
            "Ei",
            " ",
            "é",
            "\u{0}",
            "x",
            "e-",
            "e+",
            "2147483648",
            "4294967296",
            "18446744073709551616",
        ];
        const SEEDS: &[&str] = &[
            "1.5Gi",
            "100m",
            "1e3",
            "9Ei",
            "0.000000000001Ki",
            "-1.1n",
            "12E",
            "1e-1000",
            "-9223372036854775808e-10",
            "170141183460469231731.687303715884105727",
            ".5",
            "5.",
        ];
        use rand::{Rng as _, SeedableRng as _, rngs::StdRng};
        let mut rng = StdRng::seed_from_u64(0x9e37_79b9_7f4a_7c15);
        for _ in 0..20_000 {
            let mut s = String::new();
            for _ in 0..rng.random_range(0..8_usize) {
                s.push_str(PIECES[rng.random_range(0..PIECES.len())]);
            }
            check_total(&s);
        }
        for _ in 0..20_000 {
            let mut s: Vec<char> = SEEDS[rng.random_range(0..SEEDS.len())].chars().collect();
            for _ in 0..=rng.random_range(0..3_usize) {
                let c = PIECES[rng.random_range(0..PIECES.len())]
                    .chars()
                    .next()
                    .unwrap_or('0');
                match rng.random_range(0..3_usize) {
                    0 if !s.is_empty() => {
                        let at = rng.random_range(0..s.len());
                        s.remove(at);
                    }
                    1 if !s.is_empty() => {
                        let at = rng.random_range(0..s.len());
                        s[at] = c;
                    }
                    _ => s.insert(rng.random_range(0..s.len() + 1), c),
                }
            }
            check_total(&s.into_iter().collect::<String>());
        }
        // Long mantissas and extreme exponents stay fast and exact.
        let long = "1".repeat(5000);
        for suffix in ["", "Ei", "e-4990", "e-5030", "n", "e-2147483648", "e2147483647"] {
            check_total(&format!("{long}{suffix}"));
            check_total(&format!("0.{long}{suffix}"));
            check_total(&format!("-{long}.{long}{suffix}"));
        }
        assert_eq!(q(&format!("0.{}1Ki", "0".repeat(3000))).to_string(), "1n");
        assert_eq!(q(&format!("{long}e-4990")).to_string(), "1111111111111111112e-9");
        assert_eq!(q(&format!("{long}Ki")).to_string(), "9223372036854775807");
    }
}
