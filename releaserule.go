package idempotency

// The release rule as one pure function of what is known when a run ends
// (lifecycle.go's table): the lease applies its answer, and
// releaserule_test.go holds it to the table row by row.

// runEnd is what the release rule needs to know of a run that ended.
type runEnd struct {
	panicked bool // the work panicked (or settling it did)
	// committed: the handler's status went out, or the function returned;
	// a panic after that keeps the key.
	committed bool
	cut       error // why the middleware cut the run off; nil when it did not
	released  bool  // Release(ctx) was called while the work ran
	// policyReleases: the store policy releases the answer, or Do's
	// function failed (without StoreErrors).
	policyReleases bool
	tookEffect     bool // a step began, or the run resumes runs that may have begun one
	lostStep       bool // a step's result may be missing from the journal
	succeeded      bool // a 2xx the handler wrote, a function's nil error
}

// keyFate is what becomes of a run's key.
type keyFate int

const (
	fateStore   keyFate = iota // the answer is the key's
	fateRelease                // a retry runs again
	fateKeep                   // the key reads interrupted (or is taken over, or resumed)
)

// releaseRule decides the fate of a run's key: released only when nothing
// of the run can still take effect. A kept key comes with why.
func releaseRule(e runEnd) (keyFate, error) {
	switch {
	case e.panicked:
		if !e.committed && e.cut == nil && !e.tookEffect {
			return fateRelease, nil
		}
		return fateKeep, ErrHandlerPanicked
	case (e.released || e.policyReleases) && e.tookEffect:
		// Its steps did take effect, whatever the rest did: a release
		// would drop their journal (or, in a run that is not resumable,
		// let the retry run them again), and the retry would repeat them.
		// A run cut off says why it ended.
		if e.cut != nil {
			return fateKeep, e.cut
		}
		return fateKeep, errStepsJournaled
	case e.released: // the work said so itself: it did nothing
		return fateRelease, nil
	case e.cut != nil && (e.policyReleases || !e.succeeded):
		return fateKeep, e.cut
	case e.lostStep && !e.succeeded:
		return fateKeep, errStepNotJournaled
	case e.policyReleases:
		return fateRelease, nil
	}
	return fateStore, nil
}
