package faulttest

import (
	"testing"

	"github.com/sagabox/sagabox/internal/testkit"
)

func TestMain(m *testing.M) { testkit.WrapTestMain(m) }
