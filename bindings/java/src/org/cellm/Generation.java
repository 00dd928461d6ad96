package org.cellm;

/**
 * One running generation: its pieces go to the {@link TokenListener} as they are made;
 * {@link #cancel()} stops it from any thread; {@link #await()} waits for the end and gives
 * the {@link Result}, then frees the native request. {@link #close()} cancels and frees it
 * if that has not happened yet (closing twice is harmless).
 */
public final class Generation implements AutoCloseable {
    private final Engine engine;
    private final TokenListener listener;
    private final StringBuilder text = new StringBuilder(); // guarded by itself
    private final Object lock = new Object();
    // Guarded by lock:
    private long req; // the native request; 0 before attach and once freed
    private boolean attached, cancelRequested;
    private int awaiting; // threads inside Native.await
    private Result result;
    private CellmException failure;
    // Written by the engine thread:
    private volatile Result doneResult;
    private volatile Throwable listenerError;

    Generation(Engine engine, TokenListener listener) {
        this.engine = engine;
        this.listener = listener;
    }

    void attach(long r) {
        synchronized (lock) {
            req = r;
            attached = true;
            if (cancelRequested) Native.cancel(r); // the listener failed before this
        }
    }

    /** Asks the generation to stop; harmless once it has finished. Thread-safe. */
    public void cancel() {
        synchronized (lock) {
            cancelRequested = true;
            if (req != 0) Native.cancel(req);
        }
    }

    /** The text so far. */
    public String text() {
        synchronized (text) {
            return text.toString();
        }
    }

    /** True once the generation has finished. */
    public boolean isDone() {
        return doneResult != null || resultNow() != null;
    }

    private Result resultNow() {
        synchronized (lock) {
            return result;
        }
    }

    /**
     * Waits until the generation has finished and returns how: its text, why it ended,
     * token counts. A cancelled generation returns normally (FinishReason.CANCELLED).
     *
     * @throws CellmException when the generation failed, or the listener threw (its cause)
     */
    public Result await() {
        Native.refuseInCallback("Generation.await()");
        long r;
        synchronized (lock) {
            if (result == null && req == 0) {
                if (attached && doneResult != null) {
                    result = doneResult; // closed after it had finished
                } else {
                    throw new CellmException(CellmException.INVALID_ARG,
                            "the generation was closed before it finished");
                }
            }
            if (result != null) return outcome();
            r = req;
            awaiting++;
        }
        int[] v = null;
        boolean freed = false;
        try {
            v = Native.await(r);
        } finally {
            synchronized (lock) {
                if (v != null && result == null) {
                    FinishReason why = FinishReason.of(v[0]);
                    if (why == FinishReason.ERROR) {
                        failure = new CellmException(v[1], Native.text(Native.requestError(r)));
                    }
                    result = new Result(text(), why, v[2], v[3], v[4]);
                }
                awaiting--;
                if (awaiting == 0 && result != null && req != 0) {
                    Native.requestFree(req); // it has finished: this does not wait
                    req = 0;
                    freed = true;
                }
                lock.notifyAll();
            }
        }
        if (freed) engine.forget(this);
        synchronized (lock) {
            return outcome();
        }
    }

    private Result outcome() {
        Throwable t = listenerError;
        if (t != null) {
            throw new CellmException(CellmException.INVALID_ARG, "the TokenListener threw " + t, t);
        }
        if (failure != null) throw failure;
        return result;
    }

    /** Cancels the generation if it still runs and frees it. Not from a listener. */
    @Override
    public void close() {
        Native.refuseInCallback("Generation.close()");
        long r;
        synchronized (lock) {
            if (req == 0) return;
            cancelRequested = true;
            Native.cancel(req);
            boolean interrupted = false;
            while (awaiting > 0) { // an await() returns soon after the cancel
                try {
                    lock.wait();
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
            if (interrupted) Thread.currentThread().interrupt();
            r = req;
            req = 0;
        }
        if (r != 0) {
            Native.requestFree(r); // waits for the last callback
            engine.forget(this);
        }
    }

    // ---- called by the JNI glue on the engine thread ----

    void onNativePiece(byte[] utf8) {
        Native.IN_CALLBACK.set(true);
        try {
            String piece = Native.text(utf8);
            synchronized (text) {
                text.append(piece);
            }
            if (listener != null && listenerError == null) listener.onToken(piece);
        } catch (Throwable t) {
            if (listenerError == null) listenerError = t;
            cancel();
        } finally {
            Native.IN_CALLBACK.set(false);
        }
    }

    void onNativeDone(int finish, int status, int promptTokens, int completionTokens,
            int cachedTokens) {
        Native.IN_CALLBACK.set(true);
        try {
            Result r = new Result(text(), FinishReason.of(finish), promptTokens, completionTokens,
                    cachedTokens);
            doneResult = r;
            if (listener != null) listener.onComplete(r);
        } catch (Throwable t) {
            if (listenerError == null) listenerError = t;
        } finally {
            Native.IN_CALLBACK.set(false);
        }
    }
}
