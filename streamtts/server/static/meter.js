// Output meter for the page (an AudioWorklet, on the AudioContext's own clock): posts
// {sound, t} whenever the output changes between sound and silence, `t` being the context
// time of the render quantum where it changed. The page keeps the last change in
// window.streamtts.meter, so a test can measure when Stop actually silenced the output.
"use strict";

const THRESHOLD = 1e-4; // below this a sample is silence (the codec's floor is far above)

class StreamttsMeter extends AudioWorkletProcessor {
  constructor() {
    super();
    this.sound = false;
  }

  process(inputs) {
    const ch = inputs[0] && inputs[0][0];
    let loud = false;
    if (ch) {
      for (let i = 0; i < ch.length; i++) {
        if (Math.abs(ch[i]) > THRESHOLD) { loud = true; break; }
      }
    }
    if (loud !== this.sound) {
      this.sound = loud;
      this.port.postMessage({ sound: loud, t: currentTime });
    }
    return true; // keep metering between runs
  }
}

registerProcessor("streamtts-meter", StreamttsMeter);
