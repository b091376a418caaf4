package netproxy

import (
	"testing"

	"github.com/allocd/allocd/internal/testing/leakcheck"
)

func TestMain(m *testing.M) { leakcheck.MustTestMain(m) }
