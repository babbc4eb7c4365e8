// The model in the reader's browser: a small tfbook GPT, its tokenizer and its sampler, in
// plain JavaScript, on the payload that tfbook/widgets/page_model.py writes.
//
//   token ids -> token embedding + learned position embeddings -> N pre-LN blocks with
//   causal self-attention -> final LayerNorm -> logits = h E^T (tied to the embedding)
//
// Each function mirrors a Python one and keeps its name (camelCase) and shape comments:
//   GPT.forward            tfbook/models/gpt.py        PageGPT.forward
//   SelfAttentionBlock     tfbook/blocks.py            selfAttentionBlock (pre-LN residuals)
//   MultiHeadAttention     tfbook/attention.py         multiHeadAttention (causal, weights)
//   layer_norm             tfbook/normalization.py     layerNorm
//   FeedForward, gelu_tanh tfbook/feedforward.py       feedForward, geluTanh, gelu
//   KVCache, LayerCache    tfbook/cache.py             KVCache, LayerCache
//   filter_logits, kept_distribution, next_token  tfbook/generate/sampling.py
//                                        filterLogits, keptDistribution, nextToken
//   BPETokenizer.encode_ordinary  tfbook/tokenizers/bpe.py  PageTokenizer.encode
//
// One sequence at a time (B = 1): a tensor is a flat Float32Array in row-major order, so
// x (T, C) holds position t's vector at x[t * C .. t * C + C). Shape legend as in Python:
// T positions of this call, S positions seen (cached ones included), C width, H heads,
// D = C / H head size, F feed-forward width, V vocab. Sums run in double precision and are
// rounded to float32 when stored, which keeps the page within 1e-5 of PyTorch's float32.
//
// No import or export: the file loads as a classic script element (its names become globals) or
// is concatenated in front of a widget's module, as common.js is. It touches no DOM and
// makes no request; text is data here, never markup.

const PAGE_MODEL_FORMAT = "tfbook-page-gpt";

// --- decoding the payload --------------------------------------------------------------

/** base64 text -> its bytes. */
function base64Bytes(text) {
  const binary = atob(text);
  const bytes = new Uint8Array(binary.length);
  for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
  return bytes;
}

/** An IEEE half-precision number (16 bits) -> its value: sign, 5 exponent, 10 mantissa bits. */
function halfToFloat(bits) {
  const sign = bits & 0x8000 ? -1 : 1;
  const exponent = (bits >> 10) & 0x1f;
  const mantissa = bits & 0x3ff;
  if (exponent === 0) return sign * mantissa * 2 ** -24;  // subnormal: 0.m x 2^-14
  if (exponent === 31) return mantissa ? NaN : sign * Infinity;
  return sign * (1024 + mantissa) * 2 ** (exponent - 25);  // 1.m x 2^(e - 15)
}

/** One payload entry {shape, dtype, data[, scale]} -> Float32Array, as page_model.dequantise:
 *  float32 as is, float16 widened, int8 times its row's scale (rounded once to float32). */
function decodeWeight(name, entry) {
  const shape = entry && entry.shape;
  if (!Array.isArray(shape) || shape.length < 1 || shape.length > 2 ||
      !shape.every((n) => Number.isInteger(n) && n >= 1)) {
    throw new Error(`weight ${name}: expected a shape of one or two positive integers (a ` +
                    `vector or a matrix), got ${JSON.stringify(shape)}`);
  }
  const size = shape.reduce((a, b) => a * b, 1);
  const bytes = base64Bytes(entry.data);
  const view = new DataView(bytes.buffer);
  const out = new Float32Array(size);
  const width = { float32: 4, float16: 2, int8: 1 }[entry.dtype];
  if (width === undefined || bytes.length !== size * width) {
    throw new Error(`weight ${name}: expected ${size} numbers of a known dtype (float32, ` +
                    `float16, int8), got ${bytes.length} bytes of dtype ${entry.dtype}`);
  }
  if (entry.dtype === "float32") {
    for (let i = 0; i < size; i++) out[i] = view.getFloat32(4 * i, true);
  } else if (entry.dtype === "float16") {
    for (let i = 0; i < size; i++) out[i] = halfToFloat(view.getUint16(2 * i, true));
  } else {
    const scales = new DataView(base64Bytes(entry.scale).buffer);  // one float32 per row
    const cols = size / entry.shape[0];
    for (let i = 0; i < size; i++) {
      out[i] = view.getInt8(i) * scales.getFloat32(4 * Math.floor(i / cols), true);
    }
  }
  return out;
}

// --- the layers --------------------------------------------------------------------------

/** x (T, nIn) -> x W^T + b (T, nOut); W is torch's (nOut, nIn), so row o is contiguous.
 *  Four positions at a time: each weight read serves four dot products (the speed of the
 *  page is the speed of this loop). `bias` may be null (bias=False). */
function linear(x, T, nIn, weight, bias, nOut) {
  const y = new Float32Array(T * nOut);
  let t = 0;
  for (; t + 4 <= T; t += 4) {
    const a0 = t * nIn, a1 = a0 + nIn, a2 = a1 + nIn, a3 = a2 + nIn;
    for (let o = 0; o < nOut; o++) {
      const row = o * nIn;
      let s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (let i = 0; i < nIn; i++) {
        const w = weight[row + i];
        s0 += w * x[a0 + i]; s1 += w * x[a1 + i]; s2 += w * x[a2 + i]; s3 += w * x[a3 + i];
      }
      const b = bias ? bias[o] : 0;
      y[t * nOut + o] = s0 + b; y[(t + 1) * nOut + o] = s1 + b;
      y[(t + 2) * nOut + o] = s2 + b; y[(t + 3) * nOut + o] = s3 + b;
    }
  }
  for (; t < T; t++) {
    const at = t * nIn;
    for (let o = 0; o < nOut; o++) {
      const row = o * nIn;
      let sum = 0;
      for (let i = 0; i < nIn; i++) sum += weight[row + i] * x[at + i];
      y[t * nOut + o] = sum + (bias ? bias[o] : 0);
    }
  }
  return y;
}

/** gamma * (x - mu) / sqrt(var + eps) + beta over each row of x (T, C) (Ba et al., eq. 4). */
function layerNorm(x, T, C, weight, bias, eps) {
  const y = new Float32Array(T * C);
  for (let t = 0; t < T; t++) {
    const at = t * C;
    let mu = 0;
    for (let c = 0; c < C; c++) mu += x[at + c];
    mu /= C;
    let variance = 0;  // the biased variance, as torch's
    for (let c = 0; c < C; c++) variance += (x[at + c] - mu) ** 2;
    const inv = 1 / Math.sqrt(variance / C + eps);
    for (let c = 0; c < C; c++) {
      y[at + c] = (x[at + c] - mu) * inv * weight[c] + (bias ? bias[c] : 0);
    }
  }
  return y;
}

/** 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), GPT-2's GELU. */
function geluTanh(x) {
  return 0.5 * x * (1 + Math.tanh(Math.sqrt(2 / Math.PI) * (x + 0.044715 * x ** 3)));
}

/** erf(x) to about 1e-7 (Abramowitz and Stegun 7.1.26): JavaScript's Math has no erf. */
function erf(x) {
  const t = 1 / (1 + 0.3275911 * Math.abs(x));
  const poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 +
               t * (-1.453152027 + t * 1.061405429))));
  const y = 1 - poly * Math.exp(-x * x);
  return x >= 0 ? y : -y;
}

/** x Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), the exact GELU (BERT). */
function gelu(x) {
  return 0.5 * x * (1 + erf(x / Math.SQRT2));
}

/** act(x W_1 + b_1) W_2 + b_2 at each position: x (T, C) -> (T, C) (Vaswani 3.3).
 *  `record(name, tensor)`, if given, receives the hidden units (T, F) as "hidden". */
function feedForward(x, T, ff, config, record = null) {
  const act = config.activation === "gelu" ? gelu : geluTanh;
  const h = linear(x, T, config.d_model, ff.fc_in.weight, ff.fc_in.bias, config.d_ff);  // (T, F)
  for (let i = 0; i < h.length; i++) h[i] = act(h[i]);
  if (record) record("hidden", h);
  return linear(h, T, config.d_ff, ff.fc_out.weight, ff.fc_out.bias, config.d_model);  // (T, C)
}

/** The keys and values of one layer, room for maxLen positions: keys (S, C), values (S, C),
 *  head h of position s at [s * C + h * D, s * C + h * D + D). */
class LayerCache {
  constructor(maxLen, C) {
    this.maxLen = maxLen;
    this.length = 0;  // positions stored so far
    this.keys = new Float32Array(maxLen * C);
    this.values = new Float32Array(maxLen * C);
    this.C = C;
  }

  /** Append k, v (T, C): the attention then reads all `length` positions. */
  update(k, v, T) {
    if (this.length + T > this.maxLen) {
      throw new Error(`the cache holds at most ${this.maxLen} positions: ${this.length} ` +
                      `stored, ${T} more given`);
    }
    this.keys.set(k, this.length * this.C);
    this.values.set(v, this.length * this.C);
    this.length += T;
  }
}

/** One LayerCache per block: what generation keeps between steps (tfbook/cache.py). */
class KVCache {
  constructor(nLayers, maxLen, C) {
    this.layers = Array.from({ length: nLayers }, () => new LayerCache(maxLen, C));
  }

  get length() {
    return this.layers[0].length;
  }
}

/** Causal multi-head self-attention with a cache (Vaswani 3.2.2): x (T, C) -> y (T, C) and,
 *  if asked, the weights (H, T, S), where the T queries are the last T of the S positions.
 *  `record(name, tensor)`, if given, receives "q", "k", "v" (T, C) (the model explorer). */
function multiHeadAttention(x, T, attn, cache, needWeights, config, record = null) {
  const C = config.d_model, H = config.n_heads, D = C / H;
  const q = linear(x, T, C, attn.q_proj.weight, attn.q_proj.bias, C);  // (T, C) = (T, H, D)
  const k = linear(x, T, C, attn.k_proj.weight, attn.k_proj.bias, C);  // (T, C)
  const v = linear(x, T, C, attn.v_proj.weight, attn.v_proj.bias, C);  // (T, C)
  if (record) { record("q", q); record("k", k); record("v", v); }
  cache.update(k, v, T);
  const S = cache.length, start = S - T;
  const keys = cache.keys, values = cache.values;  // (S, C) each
  const y = new Float32Array(T * C);  // (T, H, D): the heads side by side, i.e. concatenated
  const weights = needWeights ? new Float32Array(H * T * S) : null;  // (H, T, S)
  const scores = new Float64Array(S);
  const out = new Float64Array(D);  // one head's output at one query, summed in double
  const sqrtD = Math.sqrt(D);
  for (let h = 0; h < H; h++) {
    for (let t = 0; t < T; t++) {
      const visible = start + t + 1;  // causal: query t sees positions 0 .. start + t
      const qAt = t * C + h * D;
      let max = -Infinity;
      for (let s = 0; s < visible; s++) {
        const kAt = s * C + h * D;
        let dot = 0;
        for (let d = 0; d < D; d++) dot += q[qAt + d] * keys[kAt + d];
        scores[s] = dot / sqrtD;  // q k^T / sqrt(D)
        if (scores[s] > max) max = scores[s];
      }
      let total = 0;
      for (let s = 0; s < visible; s++) {
        scores[s] = Math.exp(scores[s] - max);  // softmax, the max subtracted first
        total += scores[s];
      }
      const row = (h * T + t) * S;
      out.fill(0);
      for (let s = 0; s < visible; s++) {
        const w = scores[s] / total;  // later positions keep weight 0
        if (weights) weights[row + s] = w;
        const vAt = s * C + h * D;
        for (let d = 0; d < D; d++) out[d] += w * values[vAt + d];  // sum_s w_s v_s
      }
      y.set(out, qAt);
    }
  }
  return { y: linear(y, T, C, attn.out_proj.weight, attn.out_proj.bias, C), weights };  // (T, C)
}

/** x + Sublayer(Norm(x)) twice, self-attention then FFN (pre-LN, tfbook/blocks.py):
 *  x (T, C) -> (T, C) and the attention weights (H, T, S) or null. `record(name, tensor)`,
 *  if given, receives every intermediate under the names of tfbook.widgets.explorer. */
function selfAttentionBlock(x, T, block, cache, needWeights, config, record = null) {
  const C = config.d_model, eps = config.norm_eps;
  const h1 = layerNorm(x, T, C, block.norm1.weight, block.norm1.bias, eps);
  const inner = record && ((name, tensor) => record(`attn.${name}`, tensor));
  const { y, weights } = multiHeadAttention(h1, T, block.attn, cache, needWeights, config, inner);
  const x1 = new Float32Array(T * C);
  for (let i = 0; i < x1.length; i++) x1[i] = x[i] + y[i];  // the residual stream
  const h2 = layerNorm(x1, T, C, block.norm2.weight, block.norm2.bias, eps);
  const hidden = record && ((name, tensor) => record(`ff.${name}`, tensor));
  const f = feedForward(h2, T, block.ff, config, hidden);
  if (record) {  // x1 is updated in place below: the stream after attention is a copy
    record("norm1", h1); record("attn", y); record("attn.weights", weights);
    record("resid1", Float32Array.from(x1)); record("norm2", h2); record("ff", f);
  }
  for (let i = 0; i < x1.length; i++) x1[i] += f[i];
  if (record) record("resid2", x1);
  return { x: x1, weights };
}

// --- the model ---------------------------------------------------------------------------

/** A GPT from a page payload: forward, a key/value cache, generation and the tokenizer. */
class PageGPT {
  constructor(payload) {
    if (!payload || payload.format !== PAGE_MODEL_FORMAT || payload.version !== 1) {
      throw new Error(`expected a payload of tfbook's export_page_model (format ` +
                      `${PAGE_MODEL_FORMAT}, version 1), got ${String(payload && payload.format)}`);
    }
    this.config = payload.config;
    this.dtype = payload.dtype;
    if (!["gelu_tanh", "gelu"].includes(this.config.activation)) {
      throw new Error(`the page computes GELU (gelu_tanh or gelu), got ${this.config.activation}`);
    }
    this.weights = {};  // torch's names -> Float32Array
    for (const [name, entry] of Object.entries(payload.weights)) {
      this.weights[name] = decodeWeight(name, entry);
    }
    // every weight has the shape the config needs (as page_model.page_shapes): C width,
    // T context, V vocab, F feed-forward width
    const { d_model: C, max_len: T, vocab_size: V, d_ff: F } = this.config;
    const need = (name, shape) => {
      if (!this.weights[name]) throw new Error(`the payload has no weight ${name}`);
      if (JSON.stringify(payload.weights[name].shape) !== JSON.stringify(shape)) {
        throw new Error(`weight ${name}: its config needs shape [${shape.join(", ")}], ` +
                        `the payload says [${payload.weights[name].shape.join(", ")}]`);
      }
      return this.weights[name];
    };
    need("tok_emb.weight", [V, C]);
    need("pos_emb.weight", [T, C]);
    const linearOf = (prefix, nOut, nIn) => ({
      weight: need(prefix + ".weight", nIn === undefined ? [nOut] : [nOut, nIn]),
      bias: this.config.bias ? need(prefix + ".bias", [nOut]) : null,  // bias=False: none
    });
    const normOf = (prefix) => linearOf(prefix, C);  // a gain and (with bias) a bias
    this.blocks = Array.from({ length: this.config.n_layers }, (_, i) => {
      const p = `blocks.${i}.`;
      return {
        norm1: normOf(p + "norm1"), norm2: normOf(p + "norm2"),
        attn: { q_proj: linearOf(p + "attn.q_proj", C, C), k_proj: linearOf(p + "attn.k_proj", C, C),
                v_proj: linearOf(p + "attn.v_proj", C, C),
                out_proj: linearOf(p + "attn.out_proj", C, C) },
        ff: { fc_in: linearOf(p + "ff.fc_in", F, C), fc_out: linearOf(p + "ff.fc_out", C, F) },
      };
    });
    this.norm_f = normOf("norm_f");
    this.tokenizer = new PageTokenizer(payload.tokenizer);
    if (payload.tokenizer.vocab_size !== V) {  // an id the sampler draws must have a text
      throw new Error(`the model's vocab_size is ${V} but its tokenizer has ` +
                      `${payload.tokenizer.vocab_size} tokens`);
    }
  }

  /** An empty key/value cache with room for `maxLen` positions (default: the context). */
  newCache(maxLen = this.config.max_len) {
    return new KVCache(this.config.n_layers, maxLen, this.config.d_model);
  }

  /** ids (T,) -> {logits (T, V) (or (1, V) with lastOnly), attentions: per block (H, T, S)
   *  when needWeights}; position t predicts token t + 1. With a `cache` the positions
   *  continue after its contents, and this call's keys and values are appended to it.
   *  `record(name, tensor)`, if given, receives every intermediate tensor (Float32Array)
   *  under the box keys of tfbook.widgets.explorer ("tok_emb", "blocks.0.attn.q", ...). */
  forward(ids, { cache = null, needWeights = false, lastOnly = false, record = null } = {}) {
    const { d_model: C, vocab_size: V, max_len: maxLen } = this.config;
    const T = ids.length;
    const start = cache ? cache.length : 0;
    if (T === 0) throw new Error("ids must hold at least one token, got none (empty text?)");
    if (start + T > maxLen) {
      throw new Error(`sequence length ${start + T} exceeds the model's context length ` +
                      `${maxLen}: keep the last ${maxLen} tokens (fitContext)`);
    }
    for (const id of ids) {
      if (!Number.isInteger(id) || id < 0 || id >= V) {
        throw new Error(`token ids must be integers in [0, ${V}), got ${id}`);
      }
    }
    const layerCaches = (cache || this.newCache(T)).layers;
    const tokEmb = this.weights["tok_emb.weight"], posEmb = this.weights["pos_emb.weight"];
    let x = new Float32Array(T * C);  // (T, C)
    for (let t = 0; t < T; t++) {
      for (let c = 0; c < C; c++) {
        x[t * C + c] = tokEmb[ids[t] * C + c] + posEmb[(start + t) * C + c];  // E[id] + P[pos]
      }
    }
    if (record) {
      const rowsOfE = new Float32Array(T * C);  // (T, C): E[id] at each position
      ids.forEach((id, t) => rowsOfE.set(tokEmb.subarray(id * C, id * C + C), t * C));
      record("tok_emb", rowsOfE);
      record("pos_emb", posEmb.slice(start * C, (start + T) * C));
      record("embed", x);
    }
    const attentions = [];
    this.blocks.forEach((block, i) => {
      const inBlock = record && ((name, tensor) => record(`blocks.${i}.${name}`, tensor));
      const out = selfAttentionBlock(x, T, block, layerCaches[i], needWeights || Boolean(record),
                                     this.config, inBlock);
      x = out.x;  // (T, C)
      if (needWeights) attentions.push(out.weights);  // (H, T, S)
    });
    const rows = lastOnly ? 1 : T;
    if (lastOnly) x = x.subarray((T - 1) * C);  // (1, C)
    const h = layerNorm(x, rows, C, this.norm_f.weight, this.norm_f.bias, this.config.norm_eps);
    const logits = linear(h, rows, C, tokEmb, null, V);  // (rows, V): the head is E, tied
    if (record) { record("norm_f", h); record("logits", logits); }
    return { logits, attentions, T: rows, V };
  }

  /** Continue `ids` by up to maxNewTokens tokens with the sampler's settings (a seeded
   *  draw: the same settings give the same tokens); each step computes one new position
   *  against the cache. The text never grows past the context: generation stops when the
   *  prompt and the new tokens fill it (tfbook's generate refuses such a request instead).
   *  -> {tokens: the new ids, logits: per step the (V,) scores its token came from,
   *      stopped: "max_new_tokens" or "context"} */
  generate(ids, { maxNewTokens = 20, temperature = 0, topK = null, topP = null, seed = 0 } = {}) {
    checkSampling(temperature, topK, topP);
    if (!Number.isInteger(maxNewTokens) || maxNewTokens < 1) {
      throw new Error(`maxNewTokens must be a positive integer, got ${maxNewTokens}`);
    }
    const maxLen = this.config.max_len;
    if (ids.length >= maxLen) {
      throw new Error(`a prompt of ${ids.length} tokens leaves no room in the context of ` +
                      `${maxLen}: keep at most the last ${maxLen - 1} (fitContext)`);
    }
    const random = mulberry32(seed);
    const cache = this.newCache();
    const tokens = [], steps = [];
    let logits = this.forward(ids, { cache, lastOnly: true }).logits;  // the prefill: (1, V)
    for (;;) {
      steps.push(logits);
      const next = nextToken(logits, temperature, topK, topP, random);
      tokens.push(next);
      const stopped = tokens.length === maxNewTokens ? "max_new_tokens"
        : ids.length + tokens.length === maxLen ? "context" : null;
      if (stopped) return { tokens, logits: steps, stopped };
      logits = this.forward([next], { cache, lastOnly: true }).logits;  // one new position
    }
  }
}

/** The last maxLen ids, and how many were dropped: a text longer than the context is cut at
 *  its start, and the page says so. */
function fitContext(ids, maxLen) {
  const dropped = Math.max(0, ids.length - maxLen);
  return { ids: ids.slice(dropped), dropped };
}

// --- sampling ----------------------------------------------------------------------------

/** A seeded generator of numbers in [0, 1) (mulberry32): one seed, one sequence. */
function mulberry32(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let z = state;
    z = Math.imul(z ^ (z >>> 15), z | 1);
    z ^= z + Math.imul(z ^ (z >>> 7), z | 61);
    return ((z ^ (z >>> 14)) >>> 0) / 4294967296;
  };
}

/** The sampler's settings as tfbook.generate.sampling checks them, or a clear Error. */
function checkSampling(temperature, topK, topP) {
  if (typeof temperature !== "number" || !Number.isFinite(temperature) || temperature < 0) {
    throw new Error(`temperature must be a finite number >= 0 (0 = greedy), got ${temperature}`);
  }
  if (topK !== null && (!Number.isInteger(topK) || topK < 1)) {
    throw new Error(`topK must be an integer >= 1 (or null for no top-k), got ${topK}`);
  }
  if (topP !== null && !(typeof topP === "number" && topP > 0 && topP <= 1)) {
    throw new Error(`topP must lie in (0, 1] (or be null for no top-p), got ${topP}`);
  }
}

/** The first index of the largest value (greedy decoding). */
function argmax(values) {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

/** softmax of scores (V,) into probabilities (V,); a score of -Infinity gets 0. */
function probabilities(scores) {
  let max = -Infinity;
  for (const s of scores) if (s > max) max = s;
  const probs = new Float64Array(scores.length);
  let total = 0;
  for (let i = 0; i < scores.length; i++) total += probs[i] = Math.exp(scores[i] - max);
  for (let i = 0; i < probs.length; i++) probs[i] /= total;
  return probs;
}

/** Temperature, then top-k, then top-p, as tfbook's filter_logits (HF's order): logits (V,)
 *  -> scores (V,) with the removed tokens at -Infinity. Temperature 0 keeps the argmax only;
 *  top-k keeps every score >= the k-th largest; top-p removes, from the least likely up, the
 *  tokens whose mass with everything less likely is <= 1 - p, and keeps the most likely. */
function filterLogits(logits, temperature = 1, topK = null, topP = null) {
  checkSampling(temperature, topK, topP);
  const V = logits.length;
  const scores = Float32Array.from(logits);
  if (temperature === 0) {
    const best = argmax(logits);
    scores.fill(-Infinity);
    scores[best] = logits[best];
    return scores;
  }
  if (temperature !== 1) for (let i = 0; i < V; i++) scores[i] = logits[i] / temperature;
  if (topK !== null) {
    const kth = Float32Array.from(scores).sort()[V - Math.min(topK, V)];  // ascending
    for (let i = 0; i < V; i++) if (scores[i] < kth) scores[i] = -Infinity;
  }
  if (topP !== null && topP < 1) {
    const order = Array.from(scores.keys()).sort((a, b) => scores[a] - scores[b] || a - b);
    const probs = probabilities(order.map((i) => scores[i]));  // least likely first
    let tail = 0;
    for (let r = 0; r < V - 1; r++) {  // r = V - 1, the most likely, always stays
      tail += probs[r];
      if (tail <= 1 - topP) scores[order[r]] = -Infinity;
    }
  }
  return scores;
}

/** The sampler's distribution, as tfbook's kept_distribution: {kept: (V,) booleans, probs:
 *  (V,)}, the softmax of filterLogits, 0 for every removed token. The one sampler of the
 *  pages: the sampling widget's bars and nextToken's draws both come from it. */
function keptDistribution(logits, temperature = 1, topK = null, topP = null) {
  const scores = filterLogits(logits, temperature, topK, topP);
  return { kept: Array.from(scores, (x) => x !== -Infinity), probs: probabilities(scores) };
}

/** The next token from logits (V,): greedy at temperature 0 (no random number drawn), else
 *  one draw from keptDistribution's probabilities, with `random` (e.g. mulberry32(seed)). */
function nextToken(logits, temperature, topK, topP, random) {
  if (temperature === 0) return argmax(logits);
  const { probs } = keptDistribution(logits, temperature, topK, topP);
  const u = random();
  let cumulative = 0;
  for (let i = 0; i < probs.length; i++) {
    cumulative += probs[i];
    if (u < cumulative) return i;
  }
  return argmax(probs);  // u fell in the rounding gap at the top: the most likely
}

// --- the tokenizer -----------------------------------------------------------------------

/** One chunk's ids after the merges, lowest new id (the earliest merge) first, leftmost on
 *  ties, as bpe.merge_by_rank: [104, 101] with (104, 101) -> 260 gives [260]. `merges` maps
 *  left * size + right -> new id. Each round scans the chunk: fine for the words of a text. */
function mergeByRank(ids, merges, size) {
  const out = Array.from(ids);
  for (;;) {
    let best = Infinity, at = -1;
    for (let i = 0; i + 1 < out.length; i++) {
      const id = merges.get(out[i] * size + out[i + 1]);
      if (id !== undefined && id < best) { best = id; at = i; }
    }
    if (at < 0) return out;
    out.splice(at, 2, best);  // the pair becomes one token
  }
}

/** Byte-level BPE encode and decode, as BPETokenizer.encode_ordinary (special tokens are
 *  plain text) and decode (bytes that are not UTF-8 show as U+FFFD). */
/** A token's bytes as text for display, as the BPE widgets show them (tokenspans.js
 *  bytesLabel) and Python's token_label: whole UTF-8 characters as text, bytes that are only
 *  a piece of a character in hex between ‹ ›, e.g. [32, 240, 159] -> " ‹f0 9f›". */
function pageTokenLabel(bytes) {
  const strict = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });
  let text = "", piece = [];
  const flush = () => {
    if (piece.length) text += `‹${piece.map((b) => b.toString(16).padStart(2, "0")).join(" ")}›`;
    piece = [];
  };
  for (let i = 0; i < bytes.length;) {
    const lead = bytes[i];
    const n = lead < 0x80 ? 1 : lead >> 5 === 6 ? 2 : lead >> 4 === 14 ? 3 : lead >> 3 === 30 ? 4 : 0;
    let character = null;
    if (n && i + n <= bytes.length) {
      try {
        character = strict.decode(bytes.subarray(i, i + n));
      } catch (error) {
        character = null;  // bad continuation bytes, overlong form, surrogate
      }
    }
    if (character === null) {
      piece.push(bytes[i]);
      i += 1;
    } else {
      flush();
      text += character;
      i += n;
    }
  }
  flush();
  return text;
}

class PageTokenizer {
  constructor(spec) {
    if (!spec || spec.kind !== "bpe") {
      throw new Error(`expected a byte-level BPE tokenizer (kind "bpe"), got ${spec && spec.kind}`);
    }
    this.byteIds = spec.byte_ids;  // byte b -> its id
    this.size = 256 + spec.merges.length / 2;  // ordinary ids 0 .. size - 1
    this.merges = new Map();  // left * size + right -> new id
    this.vocab = new Array(this.size);  // id -> the bytes it stands for (Uint8Array)
    this.byteIds.forEach((id, b) => { this.vocab[id] = Uint8Array.of(b); });
    for (let k = 0; 2 * k < spec.merges.length; k++) {
      const left = spec.merges[2 * k], right = spec.merges[2 * k + 1], id = 256 + k;
      this.merges.set(left * this.size + right, id);
      const bytes = new Uint8Array(this.vocab[left].length + this.vocab[right].length);
      bytes.set(this.vocab[left]);
      bytes.set(this.vocab[right], this.vocab[left].length);
      this.vocab[id] = bytes;
    }
    this.special = new Map(Object.entries(spec.special_tokens).map(([text, id]) => [id, text]));
    // {L}, {N}, {WS}: Python's letters, numbers and spaces, as code point ranges
    this.split = spec.split && new RegExp(
      spec.split.source.replace(/\{(L|N|WS)\}/g, (_, name) => spec.split.classes[name]), "gu");
    this.encoder = new TextEncoder();
    // not fatal: bad bytes become U+FFFD; a leading byte-order mark is text, kept as Python keeps it
    this.decoder = new TextDecoder("utf-8", { ignoreBOM: true });
  }

  /** text -> ids; a lone surrogate (no UTF-8 form) is an Error, as Python's check_text. */
  encode(text) {
    if (typeof text !== "string") throw new TypeError(`text must be a string, got ${typeof text}`);
    const lone = /[\uD800-\uDFFF]/u.exec(text);  // with "u", a valid pair is one code point
    if (lone) {
      throw new Error(`text contains the lone surrogate U+${lone[0].charCodeAt(0).toString(16)
        .toUpperCase()} at UTF-16 index ${lone.index}, which has no UTF-8 encoding`);
    }
    const chunks = this.split ? text.match(this.split) || [] : [text];
    const ids = [];
    for (const chunk of chunks) {
      const chunkIds = Array.from(this.encoder.encode(chunk), (b) => this.byteIds[b]);
      ids.push(...mergeByRank(chunkIds, this.merges, this.size));
    }
    return ids;
  }

  /** The bytes of one id (a special token's text as UTF-8). */
  tokenBytes(id) {
    if (this.special.has(id)) return this.encoder.encode(this.special.get(id));
    if (!(id >= 0 && id < this.size)) throw new Error(`unknown token id ${id}`);
    return this.vocab[id];
  }

  /** ids -> text. */
  decode(ids) {
    const parts = ids.map((id) => this.tokenBytes(id));
    const bytes = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
    let at = 0;
    for (const p of parts) { bytes.set(p, at); at += p.length; }
    return this.decoder.decode(bytes);
  }

  /** One token as text, for display (a piece of a UTF-8 character shows as hex, ‹f0 9f›). */
  tokenText(id) {
    return pageTokenLabel(this.tokenBytes(id));
  }
}
