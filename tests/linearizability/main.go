// Command linearizability checks a history of counter operations recorded against a
// Spindle cluster with Porcupine (github.com/anishathalye/porcupine).
//
// The history is JSON lines on stdin, one operation each:
//
//	{"client": 0, "op": "add"|"get", "key": "k0", "arg": 3, "out": 17, "known": true,
//	 "call": 123, "ret": 456}
//
// Times are nanoseconds of one monotonic clock. An operation whose outcome is unknown (the
// client gave up on it) has "known": false: it may have taken effect at any time after its
// call, or never. Exit status: 0 linearizable, 1 not linearizable, 2 bad input or timeout.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

type record struct {
	Client int    `json:"client"`
	Op     string `json:"op"`
	Key    string `json:"key"`
	Arg    int64  `json:"arg"`
	Out    int64  `json:"out"`
	Known  bool   `json:"known"`
	Call   int64  `json:"call"`
	Ret    int64  `json:"ret"`
}

type input struct {
	op  string
	key string
	arg int64
}

type output struct {
	value int64
	known bool
}

// A per-key counter: add returns the new value, get the current one.
var counter = porcupine.Model{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(input).key
			if _, seen := byKey[k]; !seen {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		sort.Strings(keys)
		out := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() interface{} { return int64(0) },
	Step: func(state, in, out interface{}) (bool, interface{}) {
		s := state.(int64)
		i, o := in.(input), out.(output)
		switch i.op {
		case "add":
			next := s + i.arg
			return !o.known || o.value == next, next
		case "get":
			return !o.known || o.value == s, s
		}
		return false, s
	},
	DescribeOperation: func(in, out interface{}) string {
		i, o := in.(input), out.(output)
		result := "?"
		if o.known {
			result = fmt.Sprint(o.value)
		}
		if i.op == "add" {
			return fmt.Sprintf("add(%s, %d) -> %s", i.key, i.arg, result)
		}
		return fmt.Sprintf("get(%s) -> %s", i.key, result)
	},
}

func main() {
	var history []porcupine.Operation
	scanner := bufio.NewScanner(os.Stdin)
	scanner.Buffer(make([]byte, 1<<20), 1<<20)
	for line := 1; scanner.Scan(); line++ {
		var r record
		if err := json.Unmarshal(scanner.Bytes(), &r); err != nil {
			fmt.Fprintf(os.Stderr, "linearizability: line %d: %v\n", line, err)
			os.Exit(2)
		}
		if r.Op != "add" && r.Op != "get" {
			fmt.Fprintf(os.Stderr, "linearizability: line %d: unknown op %q\n", line, r.Op)
			os.Exit(2)
		}
		ret := r.Ret
		if !r.Known {
			ret = math.MaxInt64 // it may take effect at any time after its call
		}
		history = append(history, porcupine.Operation{
			ClientId: r.Client,
			Input:    input{op: r.Op, key: r.Key, arg: r.Arg},
			Call:     r.Call,
			Output:   output{value: r.Out, known: r.Known},
			Return:   ret,
		})
	}
	if err := scanner.Err(); err != nil {
		fmt.Fprintf(os.Stderr, "linearizability: reading the history: %v\n", err)
		os.Exit(2)
	}
	result, info := porcupine.CheckOperationsVerbose(counter, history, 60*time.Second)
	switch result {
	case porcupine.Ok:
		fmt.Printf("linearizable: %d operations\n", len(history))
	case porcupine.Illegal:
		fmt.Printf("NOT linearizable: %d operations\n", len(history))
		if path := os.Getenv("LINEARIZABILITY_HTML"); path != "" {
			if f, err := os.Create(path); err == nil {
				_ = porcupine.Visualize(counter, info, f)
				f.Close()
				fmt.Printf("visualization: %s\n", path)
			}
		}
		os.Exit(1)
	default:
		fmt.Println("unknown: the check timed out")
		os.Exit(2)
	}
}
