package faulttest

import (
	"errors"
	"fmt"
)

// validate checks a Scenario; its errors name the field at fault.
func (s *Scenario[In]) validate() error {
	var errs []error
	if s.Pool == nil {
		errs = append(errs, errors.New("Pool is required"))
	}
	if s.Dial == nil {
		errs = append(errs, errors.New("Dial is required"))
	}
	if s.Input == nil {
		errs = append(errs, errors.New("Input is required"))
	}
	if s.Start == nil {
		errs = append(errs, errors.New("Start is required"))
	}
	if s.Plan == nil {
		errs = append(errs, errors.New("Plan is required"))
	}
	for i, p := range s.Participants {
		if p.Register == nil {
			errs = append(errs, fmt.Errorf("Participants[%d].Register is required", i))
		}
	}
	if s.Sagas < 0 {
		errs = append(errs, fmt.Errorf("Sagas %d is negative", s.Sagas))
	}
	if len(errs) > 0 {
		return fmt.Errorf("faulttest: invalid scenario: %w", errors.Join(errs...))
	}
	return nil
}
