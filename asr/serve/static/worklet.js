// AudioWorklet: the microphone's first channel, resampled to the server's rate, posted as 16-bit
// PCM every `packetMs` milliseconds. Going down in rate, a low-pass filter first takes out what
// the target rate cannot hold (else it folds back as tones nobody made); what passes is then
// interpolated linearly, which its samples, many to each of its periods, allow.
class PcmResampler extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    const target = opts.targetRate || 16000;
    this.ratio = sampleRate / target; // input samples per output sample
    this.packet = Math.round((target * (opts.packetMs || 100)) / 1000);
    this.out = new Int16Array(this.packet);
    this.filled = 0;
    this.taps = this.ratio > 1 ? lowPass(target / sampleRate) : Float32Array.of(1);
    // The last taps.length - 1 inputs, then a block's: what the filter's outputs for it read.
    this.window = new Float32Array(this.taps.length - 1 + 128);
    this.filtered = new Float32Array(128);
    this.position = 0; // where the next output sample lies, in input samples from `previous`
    this.previous = 0; // the last filtered sample of the block before
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true;
    const x = this.lowPassed(input);
    // Sample i of this block is at position i + 1 after `previous` (position 0).
    while (this.position <= x.length) {
      const index = Math.floor(this.position);
      const frac = this.position - index;
      const a = index === 0 ? this.previous : x[index - 1];
      const b = index < x.length ? x[index] : a;
      const value = Math.max(-1, Math.min(1, a + (b - a) * frac));
      this.out[this.filled++] = Math.round(value * 32767);
      if (this.filled === this.packet) {
        this.port.postMessage(this.out.buffer, [this.out.buffer]);
        this.out = new Int16Array(this.packet);
        this.filled = 0;
      }
      this.position += this.ratio;
    }
    this.position -= x.length;
    this.previous = x[x.length - 1];
    return true;
  }

  // The block through the filter, which carries the inputs it still needs over to the next.
  lowPassed(input) {
    const h = this.taps, keep = h.length - 1, n = input.length;
    if (this.window.length !== keep + n) { // blocks are of 128 samples, but need not stay so
      const window = new Float32Array(keep + n);
      window.set(this.window.subarray(0, keep));
      this.window = window;
      this.filtered = new Float32Array(n);
    }
    const x = this.window, y = this.filtered;
    x.set(input, keep);
    for (let i = 0; i < n; i++) {
      let sum = 0;
      for (let k = 0; k <= keep; k++) sum += h[k] * x[i + k];
      y[i] = sum;
    }
    x.copyWithin(0, n);
    return y;
  }
}

// A windowed-sinc low-pass (Blackman: 74 dB down past its transition of 5.5 / taps) for
// `fraction` = target rate / input rate: it passes 0.4 of the target rate and stops from 0.5,
// its Nyquist frequency; its delay is half its length, under 4 ms from 48 to 8 kHz.
function lowPass(fraction) {
  const cutoff = 0.45 * fraction, width = 0.1 * fraction; // in cycles per input sample
  const half = Math.ceil(5.5 / width / 2);
  const taps = new Float32Array(2 * half + 1);
  let sum = 0;
  for (let i = -half; i <= half; i++) {
    const sinc = i === 0 ? 2 * cutoff : Math.sin(2 * Math.PI * cutoff * i) / (Math.PI * i);
    const phase = (Math.PI * i) / (half + 1);
    sum += taps[i + half] = sinc * (0.42 + 0.5 * Math.cos(phase) + 0.08 * Math.cos(2 * phase));
  }
  return taps.map((tap) => tap / sum); // a gain of 1 at 0 Hz
}

registerProcessor("pcm-resampler", PcmResampler);
