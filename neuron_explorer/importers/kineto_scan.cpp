// A range of a Kineto trace's traceEvents (wrapped as {"<key>":[...]}, see kineto_ranges.py)
// scanned straight into the columns the importer maps: each event's ph, name, cat, pid, tid and
// id as codes into the range's distinct token texts, ts and dur as float64 with their text
// spans, and the args value's span; then (ne_args_fields) the typed args' fields read from
// those spans. Built by kineto_native.py with g++ and loaded by ctypes.
//
// It accepts only a strict, plain subset of JSON (ASCII text, no escaped keys, no duplicate
// fields, numbers of the usual forms, nesting under 64 levels) and refuses anything else
// (return -1): the caller then decodes the range with msgspec, so whatever this scanner
// accepts it reads exactly as msgspec would, and everything else is msgspec's to judge.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <vector>

namespace {

enum Field { PH, NAME, CAT, PID, TID, ID, NFIELDS };

struct Interner {
  // distinct token texts (by bytes) -> code in first-seen order; the absent field's default
  // is a token of its own (offset -1). The table grows with the distinct tokens, not the
  // range (a range has few distinct names, and clearing a table per range costs)
  std::vector<int32_t> slots;  // code + 1, 0 empty
  std::vector<uint64_t> hashes;  // by code
  const char* buf = nullptr;
  int64_t* off = nullptr;
  int32_t* len = nullptr;
  int64_t n = 0;
  int32_t absent = -1;

  void init(const char* b, int64_t* o, int32_t* l) {
    buf = b, off = o, len = l, n = 0, absent = -1;
    if (slots.size() > 4096) slots.assign(4096, 0), slots.shrink_to_fit();
    else if (slots.empty()) slots.assign(1024, 0);
    else std::fill(slots.begin(), slots.end(), 0);
    hashes.clear();
  }
  void grow() {
    std::vector<int32_t> bigger(slots.size() * 2, 0);
    size_t mask = bigger.size() - 1;
    for (int32_t s : slots) {
      if (!s) continue;
      size_t at = (size_t)hashes[s - 1] & mask;
      while (bigger[at]) at = (at + 1) & mask;
      bigger[at] = s;
    }
    slots.swap(bigger);
  }
  int32_t code(const char* tok, int32_t tlen) {
    uint64_t h = 1469598103934665603ULL;
    for (int32_t i = 0; i < tlen; i++) h = (h ^ (unsigned char)tok[i]) * 1099511628211ULL;
    h ^= h >> 29;
    size_t mask = slots.size() - 1, at = (size_t)h & mask;
    while (int32_t s = slots[at]) {
      int32_t c = s - 1;
      if (hashes[c] == h && len[c] == tlen && off[c] >= 0 && memcmp(buf + off[c], tok, tlen) == 0)
        return c;
      at = (at + 1) & mask;
    }
    int32_t c = (int32_t)n++;
    off[c] = tok - buf, len[c] = tlen;
    hashes.resize(n);
    hashes[c] = h;
    slots[at] = c + 1;
    if ((size_t)n * 2 > slots.size()) grow();
    return c;
  }
  int32_t missing() {
    if (absent < 0) {
      absent = (int32_t)n++;
      off[absent] = -1, len[absent] = 0;
      hashes.resize(n);
      hashes[absent] = 0;
    }
    return absent;
  }
};

#define INLINE __attribute__((always_inline)) inline

// the bytes that end a string's plain run: a quote, a backslash, control and non-ASCII bytes
struct StopTable {
  bool t[256];
  constexpr StopTable() : t() {
    for (int c = 0; c < 256; c++) t[c] = c == '"' || c == '\\' || c < 0x20 || c >= 0x7f;
  }
};
constexpr StopTable STOP_TABLE;
const bool* const STOP = STOP_TABLE.t;

struct Scanner {
  const char* p;
  const char* end;
  bool ok = true;

  INLINE void ws() {
    while (p < end && (unsigned char)*p <= ' ' &&
           (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t'))
      p++;
  }
  INLINE bool eat(char c) {
    if (p < end && *p == c) {
      p++;
      return true;
    }
    return false;
  }
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // a string at p (its opening quote); false for anything but printable ASCII and the
  // escapes JSON allows (a \u escape of a surrogate half included: refused)
  INLINE bool string(bool escapes = true) {
    if (!eat('"')) return false;
    while (p < end) {
      while (p < end && !STOP[(unsigned char)*p]) p++;  // the plain characters, by a table
      if (p >= end) return false;
      unsigned char c = (unsigned char)*p;
      if (c == '"') {
        p++;
        return true;
      }
      if (c < 0x20 || c >= 0x7f) return false;
      if (c == '\\') {
        if (!escapes || p + 1 >= end) return false;
        char e = p[1];
        if (e == 'u') {
          if (p + 6 > end) return false;
          int v = 0;
          for (int i = 2; i < 6; i++) {
            int h = hex(p[i]);
            if (h < 0) return false;
            v = v * 16 + h;
          }
          if (v >= 0xd800 && v <= 0xdfff) return false;
          p += 6;
          continue;
        }
        if (!strchr("\"\\/bfnrt", e) || e == 0) return false;
        p += 2;
        continue;
      }
      p++;
    }
    return false;
  }
  // a number in JSON's grammar; digits: of the integer and fraction parts
  INLINE bool number(int* digits, bool* frac, bool* exp) {
    const char* s = p;
    eat('-');
    if (p >= end) return false;
    if (*p == '0') {
      p++;
    } else if (*p >= '1' && *p <= '9') {
      while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
      return false;
    }
    int d = (int)(p - s) - (*s == '-');
    *frac = *exp = false;
    if (p < end && *p == '.') {
      p++;
      const char* f = p;
      while (p < end && *p >= '0' && *p <= '9') p++;
      if (p == f) return false;
      d += (int)(p - f);
      *frac = true;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
      p++;
      if (p < end && (*p == '+' || *p == '-')) p++;
      const char* e = p;
      while (p < end && *p >= '0' && *p <= '9') p++;
      if (p == e || p - e > 3) return false;
      *exp = true;
    }
    *digits = d;
    return d <= 40;
  }
  bool literal(const char* word) {
    size_t n = strlen(word);
    if ((size_t)(end - p) < n || memcmp(p, word, n) != 0) return false;
    p += n;
    return true;
  }
  // any value (validated, skipped)
  bool value(int depth) {
    if (depth > 64 || p >= end) return false;
    char c = *p;
    if (c == '"') return string();
    if (c == '{') {
      p++;
      ws();
      if (eat('}')) return true;
      while (true) {
        if (!string()) return false;
        ws();
        if (!eat(':')) return false;
        ws();
        if (!value(depth + 1)) return false;
        ws();
        if (eat(',')) {
          ws();
          continue;
        }
        return eat('}');
      }
    }
    if (c == '[') {
      p++;
      ws();
      if (eat(']')) return true;
      while (true) {
        if (!value(depth + 1)) return false;
        ws();
        if (eat(',')) {
          ws();
          continue;
        }
        return eat(']');
      }
    }
    if (c == 't') return literal("true");
    if (c == 'f') return literal("false");
    if (c == 'n') return literal("null");
    int digits;
    bool frac, exp;
    if (!number(&digits, &frac, &exp)) return false;
    (void)exp;  // msgspec skips any number (1e400 too); a time's exponent is refused above
    return true;
  }
};

// past a value at p that the scan has already validated (args texts): strings and brackets
// only counted, about twice as fast as value()'s checks
INLINE void skip_valid(Scanner& s) {
  char first = *s.p;
  if (first != '"' && first != '{' && first != '[') {  // a number or a literal: to its end
    while (s.p < s.end && *s.p != ',' && *s.p != '}' && *s.p != ']' && (unsigned char)*s.p > ' ')
      s.p++;
    return;
  }
  int depth = 0;
  while (s.p < s.end) {
    char c = *s.p;
    if (c == '"') {
      for (s.p++; *s.p != '"'; s.p++)
        if (*s.p == '\\') s.p++;
      s.p++;
    } else if (c == '{' || c == '[') {
      depth++, s.p++;
    } else if (c == '}' || c == ']') {
      if (depth == 0) return;
      depth--, s.p++;
    } else if (c == ',' && depth == 0) {
      return;
    } else {
      s.p++;
    }
    if (depth == 0 && (c == '"' || c == '}' || c == ']')) return;
  }
}

const double POW10[] = {1e0,  1e1,  1e2,  1e3,  1e4,  1e5,  1e6,  1e7,  1e8,  1e9,  1e10, 1e11,
                        1e12, 1e13, 1e14, 1e15, 1e16, 1e17, 1e18, 1e19, 1e20, 1e21, 1e22};

// a time's text (JSON number) as the nearest float64, as msgspec reads it (correctly rounded)
bool to_double(const char* s, int32_t n, double* out) {
  const char* q = s;
  bool neg = *q == '-';
  if (neg) q++;
  uint64_t m = 0;
  int digits = 0, frac = 0;
  bool dot = false;
  for (; q < s + n; q++) {
    if (*q == '.') {
      dot = true;
      continue;
    }
    m = m * 10 + (uint64_t)(*q - '0');
    digits++;
    if (dot) frac++;
    if (digits > 15) break;
  }
  if (digits <= 15 && q == s + n) {  // exact mantissa and power: one correctly rounded division
    double v = (double)m / POW10[frac];
    *out = neg ? -v : v;
    return true;
  }
  char tmp[64];
  if (n >= 63) return false;
  memcpy(tmp, s, n);
  tmp[n] = 0;
  char* e;
  double v = strtod(tmp, &e);
  if (e != tmp + n || !std::isfinite(v)) return false;
  *out = v;
  return true;
}

}  // namespace

extern "C" {

// Scan `buf[0:size]`, a range wrapped as {"<key>":[events]} with `key` its key; out[] are the
// caller's arrays (see kineto_native.py for their order), each room for `cap` events (and
// cap + 1 tokens a field). Returns the number of events, -1 to refuse the range, -2 when
// there are more than `cap` events.
int64_t ne_scan(const char* buf, int64_t size, const char* key, int64_t key_len, int64_t cap,
                void** out, int64_t* n_tokens) {
  int32_t* codes[NFIELDS];
  int64_t* tok_off[NFIELDS];
  int32_t* tok_len[NFIELDS];
  for (int f = 0; f < NFIELDS; f++) {
    codes[f] = (int32_t*)out[f];
    tok_off[f] = (int64_t*)out[NFIELDS + f];
    tok_len[f] = (int32_t*)out[2 * NFIELDS + f];
  }
  double* times[2] = {(double*)out[18], (double*)out[19]};
  uint8_t* missing[2] = {(uint8_t*)out[20], (uint8_t*)out[21]};
  int64_t* time_off[2] = {(int64_t*)out[22], (int64_t*)out[23]};
  int32_t* time_len[2] = {(int32_t*)out[24], (int32_t*)out[25]};
  int64_t* args_off = (int64_t*)out[26];
  int32_t* args_len = (int32_t*)out[27];

  static thread_local Interner tables[NFIELDS];
  for (int f = 0; f < NFIELDS; f++) tables[f].init(buf, tok_off[f], tok_len[f]);

  Scanner s{buf, buf + size};
  s.ws();
  if (!s.eat('{')) return -1;
  s.ws();
  const char* k = s.p;
  if (!s.string(false) || s.p - k != key_len + 2 || memcmp(k + 1, key, key_len) != 0) return -1;
  s.ws();
  if (!s.eat(':')) return -1;
  s.ws();
  if (!s.eat('[')) return -1;
  s.ws();
  int64_t n = 0;
  if (!s.eat(']')) {
    while (true) {
      if (n >= cap) return -2;
      if (!s.eat('{')) return -1;
      s.ws();
      unsigned seen = 0;
      const char* tok[NFIELDS] = {};
      int32_t tlen[NFIELDS] = {};
      double tv[2] = {0, 0};
      bool tmiss[2] = {true, true};
      int64_t toff[2] = {0, 0};
      int32_t tl[2] = {0, 0};
      int64_t aoff = 0;
      int32_t alen = 0;
      if (!s.eat('}')) {
        while (true) {
          const char* ks = s.p;
          if (!s.string(false)) return -1;
          const char* kb = ks + 1;
          size_t kl = (size_t)(s.p - ks - 2);
          s.ws();
          if (!s.eat(':')) return -1;
          s.ws();
          int which = -1;  // 0-5 fields, 6 ts, 7 dur, 8 args
          switch (kl) {
            case 2:
              if (!memcmp(kb, "ph", 2)) which = PH;
              else if (!memcmp(kb, "id", 2)) which = ID;
              else if (!memcmp(kb, "ts", 2)) which = 6;
              break;
            case 3:
              if (!memcmp(kb, "cat", 3)) which = CAT;
              else if (!memcmp(kb, "pid", 3)) which = PID;
              else if (!memcmp(kb, "tid", 3)) which = TID;
              else if (!memcmp(kb, "dur", 3)) which = 7;
              break;
            case 4:
              if (!memcmp(kb, "name", 4)) which = NAME;
              else if (!memcmp(kb, "args", 4)) which = 8;
              break;
          }
          const char* v = s.p;
          if (which < 0) {
            if (!s.value(1)) return -1;
          } else {
            if (seen & (1u << which)) return -1;  // a duplicate field: msgspec's to read
            seen |= 1u << which;
            if (which == 8) {
              if (!s.value(1)) return -1;
              aoff = v - buf, alen = (int32_t)(s.p - v);
            } else if (*v == '"') {  // a string: any field but the times
              if (which >= 6 || !s.string()) return -1;
              tok[which] = v, tlen[which] = (int32_t)(s.p - v);
            } else if (*v == 'n') {  // null: only where the field's type allows None
              if (!s.literal("null")) return -1;
              if (which == ID) {
                tok[ID] = nullptr;  // None, as an absent id
              } else if (which >= 6) {
                int t = which - 6;
                tmiss[t] = true, toff[t] = v - buf, tl[t] = 4;
              } else {
                return -1;
              }
            } else {
              int digits;
              bool frac, exp;
              if (!s.number(&digits, &frac, &exp)) return -1;
              int32_t len = (int32_t)(s.p - v);
              if (which >= 6) {
                if (exp) return -1;
                int t = which - 6;
                if (!to_double(v, len, &tv[t])) return -1;
                tmiss[t] = false, toff[t] = v - buf, tl[t] = len;
              } else {
                // ints only, within int64 (msgspec reads others as errors or big ints)
                if (which == PH || which == NAME || which == CAT) return -1;
                if (frac || exp || digits > 18) return -1;
                tok[which] = v, tlen[which] = len;
              }
            }
          }
          s.ws();
          if (s.eat(',')) {
            s.ws();
            continue;
          }
          if (s.eat('}')) break;
          return -1;
        }
      }
      for (int f = 0; f < NFIELDS; f++)
        codes[f][n] = tok[f] ? tables[f].code(tok[f], tlen[f]) : tables[f].missing();
      for (int t = 0; t < 2; t++) {
        times[t][n] = tmiss[t] ? 0.0 : tv[t];
        missing[t][n] = tmiss[t];
        time_off[t][n] = toff[t], time_len[t][n] = tl[t];
      }
      args_off[n] = aoff, args_len[n] = alen;
      n++;
      s.ws();
      if (s.eat(',')) {
        s.ws();
        continue;
      }
      if (s.eat(']')) break;
      return -1;
    }
  }
  s.ws();
  if (!s.eat('}')) return -1;
  s.ws();
  if (s.p != s.end) return -1;
  for (int f = 0; f < NFIELDS; f++) n_tokens[f] = tables[f].n;
  return n;
}

// The texts buf[off[i]:off[i]+len[i]] for i in idx, joined into `out` with `sep` after each
// but the last; an empty text is written as `empty`. Returns the bytes written.
int64_t ne_gather(const char* buf, const int64_t* off, const int32_t* len, const int64_t* idx,
                  int64_t n, const char* sep, int64_t sep_len, const char* empty,
                  int64_t empty_len, char* out) {
  char* o = out;
  for (int64_t i = 0; i < n; i++) {
    int64_t j = idx[i];
    if (len[j] > 0) {
      memcpy(o, buf + off[j], (size_t)len[j]);
      o += len[j];
    } else {
      memcpy(o, empty, (size_t)empty_len);
      o += empty_len;
    }
    if (i + 1 < n) {
      memcpy(o, sep, (size_t)sep_len);
      o += sep_len;
    }
  }
  return o - out;
}
}

extern "C" {

// Codes (-1: none, else below `m`) renumbered by first use: out[i] the code's rank among the
// distinct codes in order of first appearance (-1 stays -1), used[] those codes in that order.
// Returns how many are used.
int64_t ne_first_use(const int64_t* codes, int64_t n, int64_t m, int32_t* out, int64_t* used) {
  std::vector<int32_t> rank((size_t)m, -1);
  int64_t k = 0;
  for (int64_t i = 0; i < n; i++) {
    int64_t c = codes[i];
    if (c < 0 || c >= m) {
      out[i] = -1;
      continue;
    }
    if (rank[c] < 0) rank[c] = (int32_t)k, used[k++] = c;
    out[i] = rank[c];
  }
  return k;
}
}

extern "C" {

// The `k` tokens buf[off[i]:off[i]+len[i]] (an offset of -1: `absent`) as one JSON array
// written to `out`; returns its bytes.
int64_t ne_token_array(const char* buf, const int64_t* off, const int32_t* len, int64_t k,
                       const char* absent, int64_t absent_len, char* out) {
  char* o = out;
  *o++ = '[';
  for (int64_t i = 0; i < k; i++) {
    if (i) *o++ = ',';
    if (off[i] < 0) {
      memcpy(o, absent, (size_t)absent_len);
      o += absent_len;
    } else {
      memcpy(o, buf + off[i], (size_t)len[i]);
      o += len[i];
    }
  }
  *o++ = ']';
  return o - out;
}
}

extern "C" {

// The args fields `keys` (k of them, `key_len[j]` bytes each) of events `idx` read from their
// args texts (buf[off[i]:off[i]+len[i]], empty for none), for the kineto_args structs: a field
// of kind 0 an integer (state 1, its value in val) or null/absent (state 0); of kind 1 its
// value's span (state 1, offset in val, length in vlen) or absent (state 0). state and vlen
// are k x n, field-major; val is k arrays of n (each an int column's buffer). Returns 0, or
// -1 where some event is not of that plain form (args not an object, an escaped or repeated
// key, an integer field that is not an int64 literal nor null): the caller then decodes the
// whole subset with msgspec, which judges those.
int64_t ne_args_fields(const char* buf, const int64_t* off, const int32_t* len, const int64_t* idx,
                       int64_t n, const char* const* keys, const int32_t* key_len,
                       const int32_t* kind, int64_t k, uint8_t* state, int64_t** val,
                       int32_t* vlen) {
  if (k > 64) return -1;
  memset(state, 0, (size_t)(k * n));
  for (int64_t i = 0; i < n; i++) {
    int64_t j = idx[i];
    if (len[j] <= 0) continue;
    Scanner s{buf + off[j], buf + off[j] + len[j]};
    if (!s.eat('{')) return -1;
    s.ws();
    if (s.eat('}')) continue;
    uint64_t seen = 0;  // the fields met in this object (k <= 64)
    while (true) {
      if (!s.eat('"')) return -1;
      const char* kb = s.p;  // validated by the scan: only its end and escapes to find
      while (*s.p != '"' && *s.p != '\\') s.p++;
      if (*s.p != '"') return -1;  // an escaped key could spell a field's name
      int32_t kl = (int32_t)(s.p++ - kb);
      int64_t f = -1;
      for (int64_t q = 0; q < k; q++)
        if (key_len[q] == kl && memcmp(keys[q], kb, (size_t)kl) == 0) f = q;
      s.ws();
      if (!s.eat(':')) return -1;
      s.ws();
      const char* vb = s.p;
      if (f >= 0 && (seen >> f & 1)) return -1;  // repeated: msgspec's to judge
      if (f >= 0) seen |= 1ULL << f;
      if (f >= 0 && kind[f] == 0) {
        if (s.literal("null")) {
          state[f * n + i] = 0;
        } else {
          int digits;
          bool frac, exp;
          if (!s.number(&digits, &frac, &exp) || frac || exp || digits > 18) return -1;
          state[f * n + i] = 1;
          val[f][i] = strtoll(vb, nullptr, 10);
        }
      } else {
        skip_valid(s);
        while (s.p > vb && (unsigned char)s.p[-1] <= ' ') s.p--;  // a scalar's trailing space
        if (f >= 0) state[f * n + i] = 1, val[f][i] = vb - buf, vlen[f * n + i] = (int32_t)(s.p - vb);
      }
      s.ws();
      if (s.eat(',')) {
        s.ws();
        continue;
      }
      if (!s.eat('}')) return -1;
      break;
    }
    if (s.p != s.end) return -1;
  }
  return 0;
}
}
