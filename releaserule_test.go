package idempotency

import (
	"errors"
	"testing"
)

// The release rule, row by row as lifecycle.go's table states it: a key is
// released only when nothing of the run can still take effect.
func TestTheReleaseRule(t *testing.T) {
	cutOff := ErrExecutionTimeout
	for _, tc := range []struct {
		row  string
		end  runEnd
		fate keyFate
		why  error
	}{
		{"an answer", runEnd{succeeded: true}, fateStore, nil},
		{"an error answer (Stripe's rule: it may have had effects)", runEnd{}, fateStore, nil},
		{"Release(ctx) while the work ran", runEnd{released: true}, fateRelease, nil},
		{"the store policy releases the answer", runEnd{policyReleases: true}, fateRelease, nil},
		{"the function returned an error (Do without StoreErrors)", runEnd{policyReleases: true}, fateRelease, nil},
		{"a panic before the status", runEnd{panicked: true}, fateRelease, nil},
		{"a panic after the status", runEnd{panicked: true, committed: true}, fateKeep, ErrHandlerPanicked},
		{"a panic after the cut-off", runEnd{panicked: true, cut: cutOff}, fateKeep, ErrHandlerPanicked},
		{"a panic once a step began", runEnd{panicked: true, tookEffect: true}, fateKeep, ErrHandlerPanicked},
		{"cut off, and it did not succeed", runEnd{cut: cutOff}, fateKeep, cutOff},
		{"cut off, and a policy that releases", runEnd{cut: cutOff, succeeded: true, policyReleases: true}, fateKeep, cutOff},
		{"cut off, and it still succeeded", runEnd{cut: cutOff, succeeded: true}, fateStore, nil},
		{"Release after a step began", runEnd{released: true, tookEffect: true}, fateKeep, errStepsJournaled},
		{"a releasing policy after a step began", runEnd{policyReleases: true, tookEffect: true}, fateKeep, errStepsJournaled},
		{"Release after a step began, cut off", runEnd{released: true, tookEffect: true, cut: cutOff}, fateKeep, cutOff},
		{"Release, cut off, before any step", runEnd{released: true, cut: cutOff}, fateRelease, nil},
		{"a step's journal write lost, and it did not succeed", runEnd{lostStep: true, tookEffect: true}, fateKeep, errStepNotJournaled},
		{"a step's journal write lost, and it succeeded", runEnd{lostStep: true, tookEffect: true, succeeded: true}, fateStore, nil},
	} {
		fate, why := releaseRule(tc.end)
		if fate != tc.fate || !errors.Is(why, tc.why) || (tc.why == nil) != (why == nil) {
			t.Errorf("%s: %v (%v), want %v (%v)", tc.row, fate, why, tc.fate, tc.why)
		}
	}
}
