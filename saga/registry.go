package saga

import (
	"cmp"
	"fmt"
	"slices"
	"sync"
)

// Registry holds the definitions an orchestrator runs, by name and version.
// Several versions of one name may be registered at once, so that sagas
// started with an old version finish with it. It is safe for concurrent use.
type Registry struct {
	mu      sync.RWMutex
	runners map[registryKey]Runner
}

type registryKey struct {
	name    string
	version int
}

// NewRegistry returns a registry holding runners. It panics if two of them
// have the same name and version, like MustRegister.
func NewRegistry(runners ...Runner) *Registry {
	r := &Registry{runners: make(map[registryKey]Runner)}
	r.MustRegister(runners...)
	return r
}

// Register adds runners. It fails, adding none of them, if a name and
// version is already registered or given twice.
func (r *Registry) Register(runners ...Runner) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.runners == nil {
		r.runners = make(map[registryKey]Runner)
	}
	added := make(map[registryKey]bool, len(runners))
	for _, rn := range runners {
		k := registryKey{rn.Name(), rn.Version()}
		if _, dup := r.runners[k]; dup || added[k] {
			return fmt.Errorf("register saga %s v%d: already registered", k.name, k.version)
		}
		added[k] = true
	}
	for _, rn := range runners {
		r.runners[registryKey{rn.Name(), rn.Version()}] = rn
	}
	return nil
}

// MustRegister is like Register but panics on error.
func (r *Registry) MustRegister(runners ...Runner) {
	if err := r.Register(runners...); err != nil {
		panic(err)
	}
}

// Lookup returns the runner of name at version, or an error wrapping
// ErrUnknownDefinition that names them.
func (r *Registry) Lookup(name string, version int) (Runner, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	rn, ok := r.runners[registryKey{name, version}]
	if !ok {
		return nil, fmt.Errorf("%w: %s v%d", ErrUnknownDefinition, name, version)
	}
	return rn, nil
}

// Latest returns the highest registered version of name, or an error
// wrapping ErrUnknownDefinition.
func (r *Registry) Latest(name string) (Runner, error) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var best Runner
	for k, rn := range r.runners {
		if k.name == name && (best == nil || k.version > best.Version()) {
			best = rn
		}
	}
	if best == nil {
		return nil, fmt.Errorf("%w: %s (no version)", ErrUnknownDefinition, name)
	}
	return best, nil
}

// Runners returns every registered runner, ordered by name then version.
func (r *Registry) Runners() []Runner {
	r.mu.RLock()
	defer r.mu.RUnlock()
	out := make([]Runner, 0, len(r.runners))
	for _, rn := range r.runners {
		out = append(out, rn)
	}
	slices.SortFunc(out, func(a, b Runner) int {
		return cmp.Or(cmp.Compare(a.Name(), b.Name()), cmp.Compare(a.Version(), b.Version()))
	})
	return out
}
