/**
 * Kubernetes quantities (`10M`, `1.5Gi`, `500k`, `1e6`), parsed exactly as
 * `resource.ParseQuantity` of k8s.io/apimachinery does, and rounded to an integer
 * as its `Value()` does (up, away from zero). Kubelet and containerd read the pod
 * annotations `kubernetes.io/ingress-bandwidth` and `kubernetes.io/egress-bandwidth`
 * this way (`ExtractPodBandwidthResources`), so a value they accept means the same
 * number of bits per second here.
 *
 * The grammar (apimachinery `quantity.go`):
 *
 * ```
 * <quantity>        ::= <signedNumber><suffix>
 * <signedNumber>    ::= <number> | <sign><number>
 * <number>          ::= <digits> | <digits>.<digits> | <digits>. | .<digits>
 * <suffix>          ::= <binarySI> | <decimalExponent> | <decimalSI>
 * <binarySI>        ::= Ki | Mi | Gi | Ti | Pi | Ei            (powers of 1024)
 * <decimalSI>       ::= n | u | m | "" | k | M | G | T | P | E (powers of 1000)
 * <decimalExponent> ::= "e" <signedNumber> | "E" <signedNumber>
 * ```
 *
 * `k` is 1000 and `Ki` 1024; `K` and `KB` are errors, as in Kubernetes. The arithmetic
 * is exact (bigints), so there is no floating-point rounding anywhere. Where Kubernetes
 * overflows (a value past 2^63−1, an exponent past 32 bits) the result is
 * `"too large"`/`"bad suffix"` here rather than Go's wrapped number.
 *
 * @example
 * ```ts
 * import { parseQuantity } from "./quantity.ts";
 * parseQuantity("10M"); // { ok: true, value: 10000000n }
 * parseQuantity("1Ki"); // { ok: true, value: 1024n }
 * parseQuantity("10 M"); // { ok: false, reason: "…" }
 * ```
 *
 * @module
 */

/** What {@linkcode parseQuantity} returns. */
export type QuantityResult =
  | { ok: true; value: bigint }
  | { ok: false; reason: string };

const DECIMAL: Record<string, number> = {
  "": 0,
  n: -9,
  u: -6,
  m: -3,
  k: 3,
  M: 6,
  G: 9,
  T: 12,
  P: 15,
  E: 18,
};
const BINARY: Record<string, number> = { Ki: 10, Mi: 20, Gi: 30, Ti: 40, Pi: 50, Ei: 60 };

/** Exponents past this are far outside any int64 quantity (and Go's int32 cast). */
const MAX_EXPONENT = 2 ** 31 - 1;
/** 2^63 − 1: the largest magnitude a Quantity holds. */
const INT64_MAX = 2n ** 63n - 1n;

/** The split apimachinery's scanner makes: sign, integer digits, fraction digits, suffix. */
const SHAPE = /^([+-]?)([0-9]*)(?:\.([0-9]*))?([eEinumkKMGTP]*(?:[+-]?[0-9]*)?)$/;

/**
 * Parses a Kubernetes quantity and returns its `Value()`: the number rounded up
 * (away from zero) to an integer.
 */
export function parseQuantity(text: string): QuantityResult {
  if (text === "") return { ok: false, reason: "an empty string is no quantity" };
  const m = SHAPE.exec(text);
  // The suffix part is letters, then an optional sign and digits; anything else
  // (spaces, a second dot, letters after digits) is the wrong form.
  if (!m || !/^[eEinumkKMGTP]*([+-]?[0-9]*)$/.test(m[4]) || badSuffixOrder(m[4])) {
    return {
      ok: false,
      reason: "expected a number with an optional suffix, such as 10M, 1.5G, 500k or 1Gi",
    };
  }
  const [, sign, int, frac = "", suffix] = m;
  const digits = (int + frac).replace(/^0+/, "");
  let base: 2 | 10;
  let exponent: number;
  if (suffix in DECIMAL) [base, exponent] = [10, DECIMAL[suffix]];
  else if (suffix in BINARY) [base, exponent] = [2, BINARY[suffix]];
  else if (suffix.length > 1 && (suffix[0] === "e" || suffix[0] === "E")) {
    const e = suffix.slice(1);
    if (!/^[+-]?[0-9]+$/.test(e) || Math.abs(Number(e)) > MAX_EXPONENT) {
      return { ok: false, reason: `unknown suffix "${suffix}"` };
    }
    [base, exponent] = [10, Number(e)];
  } else {
    return {
      ok: false,
      reason:
        `unknown suffix "${suffix}" (decimal: k, M, G, T, P, E; binary: Ki, Mi, Gi, Ti, Pi, Ei)`,
    };
  }
  if (digits === "") return { ok: true, value: 0n };
  // value = digits / 10^len(frac) × base^exponent, rounded up to an integer.
  let num = BigInt(digits);
  let den = 10n ** BigInt(frac.length);
  if (base === 2) num *= 2n ** BigInt(exponent);
  else {
    // The number has about `magnitude` integer digits: past 40 it is past int64; below
    // -40 it is a positive amount under 1, which rounds up to 1.
    const magnitude = digits.length - frac.length + exponent;
    if (magnitude > 40) return tooLarge();
    if (magnitude < -40) return { ok: true, value: sign === "-" ? -1n : 1n };
    if (exponent >= 0) num *= 10n ** BigInt(exponent);
    else den *= 10n ** BigInt(-exponent);
  }
  let value = (num + den - 1n) / den;
  if (value > INT64_MAX) {
    // Binary quantities are capped at 2^63−1; a decimal one overflows in Go: both are
    // far past any limit a caller checks.
    if (base === 10) return tooLarge();
    value = INT64_MAX;
  }
  return { ok: true, value: sign === "-" ? -value : value };
}

/** A sign may only follow the suffix letters when it starts an exponent's digits. */
function badSuffixOrder(suffix: string): boolean {
  const letters = /^[eEinumkKMGTP]*/.exec(suffix)![0];
  const rest = suffix.slice(letters.length);
  return rest !== "" && letters === "";
}

function tooLarge(): QuantityResult {
  return { ok: false, reason: "the value is beyond 2^63−1" };
}
