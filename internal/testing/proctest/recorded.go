package proctest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// record is what the process provider keeps per instance
// ({state_dir}/{id}/process.json).
type record struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"start_ticks"`
}

// StopRecorded ends the process groups the process provider recorded in
// the process.json files matching pattern (filepath.Glob): SIGTERM, SIGKILL
// after grace (0: SIGKILL at once). A PID is signalled only while it still
// names the recorded process (its kernel start time), so nothing else is
// touched; unreadable records are skipped.
func StopRecorded(pattern string, grace time.Duration) {
	recs, _ := filepath.Glob(pattern)
	for _, r := range recs {
		b, err := os.ReadFile(r)
		var rec record
		if err != nil || json.Unmarshal(b, &rec) != nil || rec.PID <= 0 {
			continue
		}
		if st, ok := StartTicks(rec.PID); !ok || st != rec.StartTicks {
			continue // gone, or the PID now belongs to another process
		}
		if grace > 0 {
			if syscall.Kill(-rec.PID, syscall.SIGTERM) != nil {
				continue
			}
			deadline := time.Now().Add(grace)
			for syscall.Kill(rec.PID, 0) == nil && time.Now().Before(deadline) {
				time.Sleep(50 * time.Millisecond)
			}
		}
		_ = syscall.Kill(-rec.PID, syscall.SIGKILL)
	}
}

// StartTicks is the kernel start time of a process (field 22 of
// /proc/<pid>/stat), which tells a recorded process from a later one that
// reused its PID; ok is false when the process is gone.
func StartTicks(pid int) (ticks uint64, ok bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces; count after its ')'.
	i := strings.LastIndexByte(string(b), ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	if len(f) < 20 {
		return 0, false
	}
	v, err := strconv.ParseUint(f[19], 10, 64)
	return v, err == nil
}
