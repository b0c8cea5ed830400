// dynrunner-agent runs step processes inside a job container on the executor's request.
//
// It is the job container's command (PID 1), listens on a unix socket in a directory the
// executor shares, and runs one process per connection: the executor sends a `run` frame
// (argv, env, cwd), then may send `signal` frames; the agent streams `out` frames (stdout
// and stderr on one pipe) and ends with `exit` (or `error` when the process cannot start).
// A `which` frame looks a program up on a given PATH; `env` answers the agent's own environment
// (the image's ENV: the agent is the job container's PID 1); `shutdown` kills every process
// group the agent started, answers and exits 0, so a Pod's job container ends with the job.
// See docs/containers.md.
//
// Frames: one type byte, a 4-byte big-endian length, the payload.
package main

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	frameRun    = 'r'
	frameSignal = 's'
	frameWhich  = 'w'
	frameOut    = 'o'
	frameExit   = 'x'
	frameError  = 'e'
	framePath   = 'p'
	frameEnv    = 'v' // request and answer (a JSON list of NAME=value)
	frameQuit   = 'q' // shutdown: request and answer
	maxFrame    = 1 << 24
	drainAfter  = 5 * time.Second
)

type runRequest struct {
	Argv  []string `json:"argv"`
	Env   []string `json:"env"`
	Cwd   string   `json:"cwd"`
	Drain float64  `json:"drain"` // seconds to read on after the exit (0: drainAfter)
}

type whichRequest struct {
	Name string `json:"name"`
	Path string `json:"path"`
}

// reaper waits for every child (the agent is PID 1, so orphans come to it too) and hands
// the status of a process it was asked about to its waiter.
type reaper struct {
	mu      sync.Mutex
	waiters map[int]chan syscall.WaitStatus
	early   map[int]syscall.WaitStatus
	groups  map[int]bool // the process groups of every `run` request (a step's background processes outlive it)
}

func newReaper() *reaper {
	r := &reaper{
		waiters: map[int]chan syscall.WaitStatus{},
		early:   map[int]syscall.WaitStatus{},
		groups:  map[int]bool{},
	}
	children := make(chan os.Signal, 16)
	signal.Notify(children, syscall.SIGCHLD)
	go func() {
		for range children {
			r.reap()
		}
	}()
	return r
}

func (r *reaper) reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
		r.mu.Lock()
		if ch, ok := r.waiters[pid]; ok {
			delete(r.waiters, pid)
			ch <- status
		} else {
			r.early[pid] = status
		}
		r.mu.Unlock()
	}
}

func (r *reaper) wait(pid int) syscall.WaitStatus {
	r.mu.Lock()
	if status, ok := r.early[pid]; ok {
		delete(r.early, pid)
		r.mu.Unlock()
		return status
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiters[pid] = ch
	r.mu.Unlock()
	r.reap() // a SIGCHLD may have come before the waiter was registered
	return <-ch
}

func (r *reaper) track(pid int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.groups[pid] = true
}

// killAll sends SIGKILL to every process group started; it returns how many still had a process.
func (r *reaper) killAll() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	killed := 0
	for pid := range r.groups {
		if syscall.Kill(-pid, syscall.SIGKILL) == nil {
			killed++
		}
	}
	return killed
}

type conn struct {
	c  net.Conn
	mu sync.Mutex
}

func (c *conn) send(kind byte, payload []byte) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	head := make([]byte, 5)
	head[0] = kind
	binary.BigEndian.PutUint32(head[1:], uint32(len(payload)))
	if _, err := c.c.Write(append(head, payload...)); err != nil {
		return err
	}
	return nil
}

func readFrame(r io.Reader) (byte, []byte, error) {
	head := make([]byte, 5)
	if _, err := io.ReadFull(r, head); err != nil {
		return 0, nil, err
	}
	size := binary.BigEndian.Uint32(head[1:])
	if size > maxFrame {
		return 0, nil, fmt.Errorf("frame of %d bytes", size)
	}
	payload := make([]byte, size)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	return head[0], payload, nil
}

func lookPath(name, path string) string {
	if strings.Contains(name, "/") {
		if executable(name) {
			return name
		}
		return ""
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		candidate := filepath.Join(dir, name)
		if executable(candidate) {
			return candidate
		}
	}
	return ""
}

func executable(path string) bool {
	info, err := os.Stat(path)
	return err == nil && !info.IsDir() && info.Mode()&0o111 != 0
}

func envValue(env []string, key string) string {
	for i := len(env) - 1; i >= 0; i-- {
		if strings.HasPrefix(env[i], key+"=") {
			return env[i][len(key)+1:]
		}
	}
	return ""
}

func serve(r *reaper, c *conn, socket string) {
	defer c.c.Close()
	kind, payload, err := readFrame(c.c)
	if err != nil {
		return
	}
	switch kind {
	case frameWhich:
		var req whichRequest
		if json.Unmarshal(payload, &req) == nil {
			_ = c.send(framePath, []byte(lookPath(req.Name, req.Path)))
		}
	case frameEnv:
		env, _ := json.Marshal(os.Environ())
		_ = c.send(frameEnv, env)
	case frameQuit:
		killed := r.killAll()
		_ = os.Remove(socket)
		_ = c.send(frameQuit, []byte(strconv.Itoa(killed)))
		c.c.Close()
		os.Exit(0)
	case frameRun:
		var req runRequest
		if err := json.Unmarshal(payload, &req); err != nil || len(req.Argv) == 0 {
			_ = c.send(frameError, []byte("malformed run request"))
			return
		}
		run(r, c, req)
	}
}

func run(r *reaper, c *conn, req runRequest) {
	program := lookPath(req.Argv[0], envValue(req.Env, "PATH"))
	if program == "" {
		_ = c.send(frameError, []byte(req.Argv[0]+": not found"))
		return
	}
	readEnd, writeEnd, err := os.Pipe()
	if err != nil {
		_ = c.send(frameError, []byte(err.Error()))
		return
	}
	null, _ := os.Open(os.DevNull)
	attr := &syscall.ProcAttr{
		Dir:   req.Cwd,
		Env:   req.Env,
		Files: []uintptr{null.Fd(), writeEnd.Fd(), writeEnd.Fd()},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	}
	pid, err := syscall.ForkExec(program, req.Argv, attr)
	writeEnd.Close()
	null.Close()
	if err != nil {
		readEnd.Close()
		_ = c.send(frameError, []byte(err.Error()))
		return
	}
	r.track(pid)
	drained := make(chan struct{})
	go func() {
		defer close(drained)
		buf := make([]byte, 1<<18)
		for {
			n, err := readEnd.Read(buf)
			if n > 0 {
				if c.send(frameOut, buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	go func() { // signals from the executor, for the process's group
		for {
			kind, payload, err := readFrame(c.c)
			if err != nil {
				return
			}
			if kind == frameSignal {
				if n, err := strconv.Atoi(string(payload)); err == nil {
					_ = syscall.Kill(-pid, syscall.Signal(n))
				}
			}
		}
	}()
	status := r.wait(pid)
	drain := drainAfter
	if req.Drain > 0 {
		drain = time.Duration(req.Drain * float64(time.Second))
	}
	select { // a background process may hold the pipe: read on for a while, as GitHub does
	case <-drained:
	case <-time.After(drain):
		readEnd.Close()
		<-drained
	}
	readEnd.Close()
	code := status.ExitStatus()
	if status.Signaled() {
		code = 128 + int(status.Signal())
	}
	_ = c.send(frameExit, []byte(strconv.Itoa(code)))
}

func main() {
	socket := "/__dynrunner/agent.sock"
	if len(os.Args) > 1 {
		socket = os.Args[1]
	}
	r := newReaper()
	_ = os.Remove(socket)
	listener, err := net.Listen("unix", socket+".tmp")
	if err != nil {
		fmt.Fprintln(os.Stderr, "dynrunner-agent:", err)
		os.Exit(1)
	}
	_ = os.Chmod(socket+".tmp", 0o666)
	if err := os.Rename(socket+".tmp", socket); err != nil { // the socket appears ready to use
		fmt.Fprintln(os.Stderr, "dynrunner-agent:", err)
		os.Exit(1)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		_ = os.Remove(socket)
		os.Exit(0)
	}()
	for {
		c, err := listener.Accept()
		if err != nil {
			continue
		}
		go serve(r, &conn{c: c}, socket)
	}
}
