// AudioWorklet: the microphone's first channel, resampled to the server's rate by linear
// interpolation, posted as 16-bit PCM every `packetMs` milliseconds.
class PcmResampler extends AudioWorkletProcessor {
  constructor(options) {
    super();
    const opts = options.processorOptions || {};
    this.ratio = sampleRate / (opts.targetRate || 16000); // input samples per output sample
    this.packet = Math.round(((opts.targetRate || 16000) * (opts.packetMs || 100)) / 1000);
    this.out = new Int16Array(this.packet);
    this.filled = 0;
    this.position = 0; // where the next output sample lies, in input samples from `previous`
    this.previous = 0; // the last input sample of the block before
  }

  process(inputs) {
    const input = inputs[0] && inputs[0][0];
    if (!input) return true;
    // Sample i of this block is at position i + 1 after `previous` (position 0).
    while (this.position <= input.length) {
      const index = Math.floor(this.position);
      const frac = this.position - index;
      const a = index === 0 ? this.previous : input[index - 1];
      const b = index < input.length ? input[index] : a;
      const value = Math.max(-1, Math.min(1, a + (b - a) * frac));
      this.out[this.filled++] = Math.round(value * 32767);
      if (this.filled === this.packet) {
        this.port.postMessage(this.out.buffer, [this.out.buffer]);
        this.out = new Int16Array(this.packet);
        this.filled = 0;
      }
      this.position += this.ratio;
    }
    this.position -= input.length;
    this.previous = input[input.length - 1];
    return true;
  }
}

registerProcessor("pcm-resampler", PcmResampler);
