#include "tls/aes_gcm_vaes.h"

#include <cpuid.h>
#include <immintrin.h>
#include <openssl/crypto.h>

#include <cstring>

// Every function that touches a vector register is compiled for these instructions alone; the
// callers (records.cc) reach them only after cpu_has_vaes().
#define COMM_VAES __attribute__((target("avx2,vaes,vpclmulqdq,aes,pclmul,ssse3")))

namespace comm::tls::gcm {

bool cpu_has_vaes() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (__get_cpuid(1, &a, &b, &c, &d) == 0) return false;
  const bool aes = c & (1u << 25), pclmul = c & (1u << 1), ssse3 = c & (1u << 9);
  const bool osxsave = c & (1u << 27), avx = c & (1u << 28);
  if (!aes || !pclmul || !ssse3 || !osxsave || !avx) return false;
  // The OS must save the xmm and ymm state across context switches (XCR0 bits 1 and 2).
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__ volatile("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  if ((xcr0_lo & 6u) != 6u) return false;
  if (__get_cpuid_max(0, nullptr) < 7) return false;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx2 = b & (1u << 5), vaes = c & (1u << 9), vpclmul = c & (1u << 10);
  return avx2 && vaes && vpclmul;
}

namespace {

// GHASH works on bit-reflected field elements (SP 800-38D section 6.3: the first bit of a block is
// the coefficient of x^0). Byte-reversing a block makes the whole 128-bit register the reflected
// polynomial, so that PCLMULQDQ multiplies it directly (Intel's "Carry-Less Multiplication and its
// Usage for Computing the GCM Mode" white paper, the byte-reflected method).
COMM_VAES inline __m128i rev_mask() { return _mm_set_epi8(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15); }
COMM_VAES inline __m128i bswap(__m128i v) { return _mm_shuffle_epi8(v, rev_mask()); }
COMM_VAES inline __m128i load(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
COMM_VAES inline void store(uint8_t* p, __m128i v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), v); }

// x^128 + x^7 + x^2 + x + 1 reflected and shifted: x^127 + x^126 + x^121 + 1 as (high, low) qwords.
COMM_VAES inline __m128i gf_poly() {
  return _mm_set_epi64x(static_cast<long long>(0xc200000000000000ull), 1);
}

// The 256-bit carry-less product lo + mi*x^64 + hi*x^128 reduced, times x^-128 (a Montgomery
// reduction in two folds of 64 bits, each one clmul by the polynomial's upper half). The x^-128 and
// the one-bit shift that reflected operands carry are both paid for once in the hash key: the
// powers of H are stored pre-multiplied (expand_key), so mul(a, H') is GHASH's a * H.
COMM_VAES inline __m128i reduce(__m128i lo, __m128i mi, __m128i hi) {
  const __m128i poly = gf_poly();
  __m128i t = _mm_clmulepi64_si128(lo, poly, 0x10);  // lo's low qword times the poly's high one
  mi = _mm_xor_si128(mi, _mm_xor_si128(_mm_shuffle_epi32(lo, 0x4e), t));
  t = _mm_clmulepi64_si128(mi, poly, 0x10);
  return _mm_xor_si128(hi, _mm_xor_si128(_mm_shuffle_epi32(mi, 0x4e), t));
}

// One product at a time (additional data, the last blocks, the tag, the key's powers): schoolbook,
// four 64x64 products; the main loop (group) uses Karatsuba's three.
COMM_VAES inline __m128i mul(__m128i a, __m128i b) {
  const __m128i lo = _mm_clmulepi64_si128(a, b, 0x00);
  const __m128i mi = _mm_xor_si128(_mm_clmulepi64_si128(a, b, 0x01), _mm_clmulepi64_si128(a, b, 0x10));
  const __m128i hi = _mm_clmulepi64_si128(a, b, 0x11);
  return reduce(lo, mi, hi);
}

COMM_VAES inline __m128i aes_block(const Key& k, __m128i b) {
  b = _mm_xor_si128(b, load(k.round[0]));
  for (int r = 1; r < 10; ++r) b = _mm_aesenc_si128(b, load(k.round[r]));
  return _mm_aesenclast_si128(b, load(k.round[10]));
}

// FIPS 197 section 5.2's key expansion, one round key from the last and AESKEYGENASSIST's word.
COMM_VAES inline __m128i next_round_key(__m128i k, __m128i assist) {
  assist = _mm_shuffle_epi32(assist, 0xff);
  k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
  k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
  k = _mm_xor_si128(k, _mm_slli_si128(k, 4));
  return _mm_xor_si128(k, assist);
}

// Whole blocks: CTR (section 6.5) and GHASH of the ciphertext, kBlocks blocks a round with one
// reduction for them all (sum of X_i * H^(kBlocks+1-i), section 6.4's recurrence unrolled), then
// one block at a time. ctr and x are byte-reversed. kBlocks/2 independent AES chains, so that
// VAES's pipeline (latency 4) has work while a chain waits.
constexpr int kLanes = kBlocks / 2;  // ymm registers per round

// What the main loop keeps in registers.
struct Wide {
  __m256i rev, step, rk[11], hp[kLanes], hk[kLanes], ctrs[kLanes];
};

// One group: when kAes the key stream of kLanes counter pairs into ks, when kHash GHASH of g
// (kBlocks byte-reversed ciphertext blocks) into acc, its instructions placed between the AES
// rounds: the two chains are independent, and the CPU overlaps them better when they sit near
// each other in the instruction stream (about 5 % faster than one after the other, measured).
template <bool kHash, bool kAes = true>
COMM_VAES __attribute__((always_inline)) inline void group(Wide& w, const __m256i* g, __m128i* acc, __m256i* ks) {
  __m256i b[kLanes];
#pragma GCC unroll 8
  for (int i = 0; i < kLanes; ++i) {
    b[i] = _mm256_xor_si256(_mm256_shuffle_epi8(w.ctrs[i], w.rev), w.rk[0]);
    w.ctrs[i] = _mm256_add_epi32(w.ctrs[i], w.step);
  }
  __m256i lo = _mm256_setzero_si256(), mi = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
#pragma GCC unroll 9
  for (int r = 1; r < 10; ++r) {
#pragma GCC unroll 8
    for (int i = 0; i < kLanes; ++i)
      if (kAes) b[i] = _mm256_aesenc_epi128(b[i], w.rk[r]);
    if (!kHash) continue;
    if (r <= kLanes) {  // one pair of blocks per round; Karatsuba, three products a block
      const int i = r - 1;
      __m256i x = g[i];
      if (i == 0) x = _mm256_xor_si256(x, _mm256_zextsi128_si256(*acc));  // the running hash joins the first block
      lo = _mm256_xor_si256(lo, _mm256_clmulepi64_epi128(x, w.hp[i], 0x00));
      hi = _mm256_xor_si256(hi, _mm256_clmulepi64_epi128(x, w.hp[i], 0x11));
      mi = _mm256_xor_si256(mi, _mm256_clmulepi64_epi128(_mm256_xor_si256(x, _mm256_shuffle_epi32(x, 0x4e)), w.hk[i], 0x00));
    } else if (r == kLanes + 1) {
      // (g_lo^g_hi)(h_lo^h_hi) ^ lo ^ hi is the middle term; the two lanes' sums add (reduction
      // is linear): one reduction for all the blocks.
      mi = _mm256_xor_si256(mi, _mm256_xor_si256(lo, hi));
      *acc = reduce(_mm_xor_si128(_mm256_castsi256_si128(lo), _mm256_extracti128_si256(lo, 1)),
                    _mm_xor_si128(_mm256_castsi256_si128(mi), _mm256_extracti128_si256(mi, 1)),
                    _mm_xor_si128(_mm256_castsi256_si128(hi), _mm256_extracti128_si256(hi, 1)));
    }
  }
#pragma GCC unroll 8
  for (int i = 0; i < kLanes; ++i)
    if (kAes) ks[i] = _mm256_aesenclast_epi128(b[i], w.rk[10]);
}

template <bool kEncrypt>
COMM_VAES void blocks(const Key& k, __m128i* ctr, __m128i* x, const uint8_t* in, uint8_t* out, size_t n) {
  Wide w;
  w.rev = _mm256_broadcastsi128_si256(rev_mask());
  for (int r = 0; r < 11; ++r) w.rk[r] = _mm256_broadcastsi128_si256(load(k.round[r]));
  for (int i = 0; i < kLanes; ++i) {
    w.hp[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k.hpow[2 * i]));  // no alignment assumed of a Key's home
    w.hk[i] = _mm256_xor_si256(w.hp[i], _mm256_shuffle_epi32(w.hp[i], 0x4e));  // Karatsuba's h_lo^h_hi
  }
  // inc32 (section 6.2): only the low 32 bits count; the byte-reversed form holds them in the
  // low dword, where a 32-bit add wraps as inc32 does.
  w.ctrs[0] = _mm256_add_epi32(_mm256_broadcastsi128_si256(*ctr), _mm256_set_epi32(0, 0, 0, 1, 0, 0, 0, 0));
  const __m256i two = _mm256_set_epi32(0, 0, 0, 2, 0, 0, 0, 2);
  w.step = _mm256_set_epi32(0, 0, 0, kBlocks, 0, 0, 0, kBlocks);
  for (int i = 1; i < kLanes; ++i) w.ctrs[i] = _mm256_add_epi32(w.ctrs[i - 1], two);
  __m128i acc = *x;
  __m256i g[kLanes], ks[kLanes];
  bool pending = false;  // sealing: g holds the last group's ciphertext, hashed with the next group
  for (; n >= kBlocks; n -= kBlocks, in += 16 * kBlocks, out += 16 * kBlocks) {
    const auto* src = reinterpret_cast<const __m256i*>(in);
    auto* dst = reinterpret_cast<__m256i*>(out);
    if (!kEncrypt) {  // opening hashes what it reads, beside its own key stream
#pragma GCC unroll 8
      for (int i = 0; i < kLanes; ++i) g[i] = _mm256_shuffle_epi8(_mm256_loadu_si256(src + i), w.rev);
      group<true>(w, g, &acc, ks);
    } else if (pending) {
      group<true>(w, g, &acc, ks);
    } else {
      group<false>(w, g, &acc, ks);
    }
#pragma GCC unroll 8
    for (int i = 0; i < kLanes; ++i) {
      const __m256i o = _mm256_xor_si256(_mm256_loadu_si256(src + i), ks[i]);
      _mm256_storeu_si256(dst + i, o);
      if (kEncrypt) g[i] = _mm256_shuffle_epi8(o, w.rev);
    }
    pending = kEncrypt;
  }
  if (pending) {  // the last group's ciphertext, with no key stream beside it
    __m256i saved[kLanes];
    for (int i = 0; i < kLanes; ++i) saved[i] = w.ctrs[i];
    group<true, false>(w, g, &acc, ks);
    for (int i = 0; i < kLanes; ++i) w.ctrs[i] = saved[i];
    OPENSSL_cleanse(saved, sizeof saved);
  }
  const auto& ctrs = w.ctrs;
  __m128i c = _mm256_castsi256_si128(ctrs[0]);  // the next counter (lane 0 of the next group)
  const __m128i h1 = load(k.hpow[kBlocks - 1]);
  for (; n > 0; --n, in += 16, out += 16) {
    const __m128i d = load(in);
    const __m128i o = _mm_xor_si128(d, aes_block(k, bswap(c)));
    c = _mm_add_epi32(c, _mm_set_epi32(0, 0, 0, 1));
    store(out, o);
    acc = mul(_mm_xor_si128(acc, bswap(kEncrypt ? o : d)), h1);
  }
  *ctr = c;
  *x = acc;
  // The round keys, hash powers, key stream and hashed text spilled to this frame are secret, as
  // the Key and the Stream are (their owners wipe those): not left behind on the stack.
  OPENSSL_cleanse(&w, sizeof w);
  OPENSSL_cleanse(g, sizeof g);
  OPENSSL_cleanse(ks, sizeof ks);
}

}  // namespace

COMM_VAES void expand_key(Key* k, const uint8_t key[16]) {
  __m128i r = load(key);
  store(k->round[0], r);
#define COMM_ROUND(i, rcon)                                            \
  r = next_round_key(r, _mm_aeskeygenassist_si128(r, rcon));            \
  store(k->round[i], r);
  COMM_ROUND(1, 0x01) COMM_ROUND(2, 0x02) COMM_ROUND(3, 0x04) COMM_ROUND(4, 0x08) COMM_ROUND(5, 0x10)
  COMM_ROUND(6, 0x20) COMM_ROUND(7, 0x40) COMM_ROUND(8, 0x80) COMM_ROUND(9, 0x1b) COMM_ROUND(10, 0x36)
#undef COMM_ROUND
  // H = E(K, 0^128) (section 6.4), byte-reversed, times x: reflected operands give a product one
  // bit short, and reduce() leaves a factor x^-128 that the pre-multiplied powers cancel, since
  // mul(a, b) = a*b*c for one constant c and H' = H/c gives mul(H^i', H') = H^(i+1)'.
  alignas(16) uint8_t hb[16];
  store(hb, bswap(aes_block(*k, _mm_setzero_si128())));
  uint64_t lo, hi;
  std::memcpy(&lo, hb, 8);
  std::memcpy(&hi, hb + 8, 8);
  const uint64_t carry = 0 - (hi >> 63);  // all ones when x^127's bit goes out: no branch on the key
  hi = (hi << 1) | (lo >> 63);
  lo <<= 1;
  hi ^= carry & 0xc200000000000000ull;
  lo ^= carry & 1;
  __m128i h = _mm_set_epi64x(static_cast<long long>(hi), static_cast<long long>(lo));
  OPENSSL_cleanse(hb, sizeof hb);
  __m128i p = h;
  for (int i = kBlocks - 1; i >= 0; --i) {  // hpow[kBlocks - 1] = H^1 ... hpow[0] = H^kBlocks
    store(k->hpow[i], p);
    p = mul(p, h);
  }
  // The hash key's copies on this frame: wiped as the Key's owner wipes the Key.
  OPENSSL_cleanse(&lo, sizeof lo);
  OPENSSL_cleanse(&hi, sizeof hi);
  OPENSSL_cleanse(&h, sizeof h);
  OPENSSL_cleanse(&p, sizeof p);
}

COMM_VAES Stream::Stream(const Key& k, const uint8_t nonce[12], const uint8_t* aad, size_t aad_len)
    : key_(k), aad_len_(aad_len) {
  // J0 = IV || 0^31 || 1 for a 96-bit IV (section 7.1 step 2); the text starts at inc32(J0).
  alignas(16) uint8_t j0[16] = {};
  std::memcpy(j0, nonce, 12);
  j0[15] = 1;
  store(mask_, aes_block(k, load(j0)));
  j0[15] = 2;
  store(ctr_, bswap(load(j0)));
  __m128i x = _mm_setzero_si128();
  const __m128i h1 = load(k.hpow[kBlocks - 1]);
  for (size_t at = 0; at < aad_len; at += 16) {
    alignas(16) uint8_t b[16] = {};  // the last block zero-padded (section 7.1 step 4)
    std::memcpy(b, aad + at, aad_len - at < 16 ? aad_len - at : 16);
    x = mul(_mm_xor_si128(x, bswap(load(b))), h1);
  }
  store(x_, x);
}

Stream::~Stream() {
  OPENSSL_cleanse(ks_, sizeof ks_);
  OPENSSL_cleanse(part_, sizeof part_);
  OPENSSL_cleanse(mask_, sizeof mask_);
  OPENSSL_cleanse(x_, sizeof x_);
}

COMM_VAES void Stream::crypt(const uint8_t* in, uint8_t* out, size_t n, bool encrypt) {
  text_len_ += n;
  __m128i x = load(x_);
  const __m128i h1 = load(key_.hpow[kBlocks - 1]);
  // Finish a block an earlier piece ended inside, byte by byte from its saved key stream.
  while (pos_ > 0 && n > 0) {
    const uint8_t p = *in++;
    const uint8_t o = static_cast<uint8_t>(p ^ ks_[pos_]);
    *out++ = o;
    part_[pos_++] = encrypt ? o : p;
    --n;
    if (pos_ == 16) {
      x = mul(_mm_xor_si128(x, bswap(load(part_))), h1);
      pos_ = 0;
    }
  }
  __m128i ctr = load(ctr_);
  const size_t whole = n / 16;
  if (whole > 0) {
    if (encrypt) blocks<true>(key_, &ctr, &x, in, out, whole);
    else blocks<false>(key_, &ctr, &x, in, out, whole);
    in += 16 * whole;
    out += 16 * whole;
    n -= 16 * whole;
  }
  if (n > 0) {  // a block this piece ends inside: keep its key stream for the next piece
    store(ks_, aes_block(key_, bswap(ctr)));
    ctr = _mm_add_epi32(ctr, _mm_set_epi32(0, 0, 0, 1));
    for (; n > 0; --n) {
      const uint8_t p = *in++;
      const uint8_t o = static_cast<uint8_t>(p ^ ks_[pos_]);
      *out++ = o;
      part_[pos_++] = encrypt ? o : p;
    }
  }
  store(ctr_, ctr);
  store(x_, x);
}

// Leaves the stream as it was (the last partial block is padded in a copy), so a second tag(), or
// more text and then tag(), gives the tag of the text so far instead of a wrong one.
COMM_VAES void Stream::tag(uint8_t out[16]) {
  __m128i x = load(x_);
  const __m128i h1 = load(key_.hpow[kBlocks - 1]);
  if (pos_ > 0) {  // the last partial block, zero-padded (section 7.1 step 4)
    alignas(16) uint8_t last[16] = {};
    std::memcpy(last, part_, pos_);
    x = mul(_mm_xor_si128(x, bswap(load(last))), h1);
    OPENSSL_cleanse(last, sizeof last);
  }
  // len(A) || len(C) in bits, each 64 bits big-endian; byte-reversed, len(C) is the low qword.
  const __m128i lens = _mm_set_epi64x(static_cast<long long>(aad_len_ * 8), static_cast<long long>(text_len_ * 8));
  x = mul(_mm_xor_si128(x, lens), h1);
  store(out, _mm_xor_si128(bswap(x), load(mask_)));  // section 7.1 step 6: T = MSB(GCTR(J0, S))
  OPENSSL_cleanse(&x, sizeof x);
}

}  // namespace comm::tls::gcm
