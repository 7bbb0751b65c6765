//go:build race

package simulate

// raceEnabled makes TestAdaptiveGrid run a fifth of its sample under the
// race detector, which slows the simulation about fourfold.
const raceEnabled = true
